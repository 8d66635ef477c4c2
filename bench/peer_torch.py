#!/usr/bin/env python3
"""PyTorch (CPU) at the same work `mixtrain bench` measures, for side-by-side ratios.

  peer_torch.py matmul [--sizes 512,1024,2048] [--seconds S] [--threads T]
      C = A @ B, all n x n in the dtype under test; best of repeated runs over about S seconds per case.
  peer_torch.py step --variant float32|autocast_bfloat16 [--hidden 4096,4096] [--batch-size 256]
                     [--steps N] [--threads T]
      One training step of the MLP `mixtrain bench step` builds: 784-H1-H2-10, ReLU, Adam (lr 1e-3),
      cross-entropy on logits; the median over N steps after 2 warm-up steps. autocast_bfloat16 runs the
      forward pass under torch.autocast("cpu", torch.bfloat16), the usual PyTorch CPU mixed precision
      (PyTorch's CPU autocast has no float16), with float32 weights and optimizer.
  peer_torch.py step --model cnn --variant float32|autocast_bfloat16 [--hidden 128] [--batch-size 256]
                     [--steps N] [--threads T] [--layout channels_last|nchw]
      One training step of the CNN `mixtrain bench step --model cnn` builds, on 28x28x1 images:
      [Conv2d(f, 3x3, same, no bias) - BatchNorm2d (Keras momentum 0.9, i.e. PyTorch momentum 0.1, eps 1e-3)
      - ReLU - MaxPool2d(2)] for f = 32, 64, Flatten, Linear(3136, H) + ReLU, Dropout(0.3), Linear(H, 10);
      Adam (lr 1e-3, eps 1e-7 as Keras), cross-entropy on logits, in training mode. Under autocast_bfloat16
      the last Linear runs outside autocast, in float32, as mixtrain keeps its logits layer in float32.
      The layout defaults to channels_last (NHWC in memory, as mixtrain's tensors; on this CPU build it is
      faster than NCHW); --layout nchw measures PyTorch's default layout.

Prints one JSON object per line. GFLOP/s of an MLP step counts 6 x batch x weights (forward 2, backward 4),
as mixtrain does; a convolution reuses its weights across positions, so for the CNN it is null, as
mixtrain prints none.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the caller skips this peer on exit status 3
    print(f"peer_torch: PyTorch is not importable by {sys.executable}: {e}", file=sys.stderr)
    sys.exit(3)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def loaded_blas():
    """The BLAS library this process loaded (PyTorch's float32 CPU matmul goes through it)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line and "/" in line}
    except OSError:
        return None
    return ", ".join(sorted(paths)) or None


def emit(obj):
    print(json.dumps(obj), flush=True)


def bench_matmul(sizes, seconds):
    gen = torch.Generator().manual_seed(1)
    for n in sizes:
        a32 = torch.rand(n, n, generator=gen) * 2 - 1
        b32 = torch.rand(n, n, generator=gen) * 2 - 1
        for name, dtype in DTYPES.items():
            a, b = a32.to(dtype), b32.to(dtype)
            c = torch.empty(n, n, dtype=dtype)
            try:
                torch.mm(a, b, out=c)  # untimed: first touch, and fails here if not implemented
            except RuntimeError as e:
                emit({"what": "peer_torch_matmul", "n": n, "dtype": name, "supported": False,
                      "reason": str(e).splitlines()[0]})
                continue
            best, runs, start = float("inf"), 0, time.perf_counter()
            while runs < 2 or (time.perf_counter() - start < seconds and runs < 1000):
                t = time.perf_counter()
                torch.mm(a, b, out=c)
                best = min(best, time.perf_counter() - t)
                runs += 1
            emit({"what": "peer_torch_matmul", "n": n, "dtype": name, "supported": True,
                  "gflops": 2.0 * n ** 3 / best / 1e9, "runs": runs})


def bench_step(variant, hidden, batch_size, steps):
    torch.manual_seed(1)
    inputs, classes = 784, 10  # the Fashion-MNIST shapes, as in mixtrain bench step
    layers, width = [], inputs
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, classes))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(batch_size, inputs)
    y = torch.randint(0, classes, (batch_size,))
    use_autocast = variant == "autocast_bfloat16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):  # warm-up: Adam state, allocator
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    weights = sum(p.numel() for p in model.parameters())
    emit({"what": "peer_torch_step", "model": "mlp", "variant": variant, "hidden": hidden,
          "batch_size": batch_size, "steps": steps, "ms_per_step": median * 1e3, "steps_per_second": 1.0 / median,
          "gflops": 6.0 * batch_size * weights / median / 1e9})


class Cnn(torch.nn.Module):
    """The cnn of mixtrain's model zoo (src/train/model_zoo.cpp), in PyTorch modules."""

    def __init__(self, hidden, classes, channels_last):
        super().__init__()
        layers, channels = [], 1
        for filters in (32, 64):
            # No bias before BatchNorm: its beta is the bias. Keras momentum 0.9 is PyTorch momentum 0.1.
            layers += [torch.nn.Conv2d(channels, filters, 3, padding="same", bias=False),
                       torch.nn.BatchNorm2d(filters, eps=1e-3, momentum=0.1),
                       torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
            channels = filters
        self.features = torch.nn.Sequential(*layers)
        self.channels_last = channels_last
        self.hidden = torch.nn.Sequential(torch.nn.Linear(7 * 7 * channels, hidden), torch.nn.ReLU(),
                                          torch.nn.Dropout(0.3))
        self.logits = torch.nn.Linear(hidden, classes)

    def body(self, x):  # x: (B, 1, 28, 28)
        f = self.features(x)  # (B, 64, 7, 7)
        # Flatten in the order the memory holds: (B, 7, 7, 64) as Keras does for channels_last (a view,
        # no copy), (B, 64, 7, 7) for NCHW. Either is the same model up to a permutation of the weights.
        f = f.permute(0, 2, 3, 1).reshape(f.shape[0], -1) if self.channels_last else f.flatten(1)
        return self.hidden(f)  # (B, H)


def bench_cnn_step(variant, hidden, batch_size, steps, layout):
    torch.manual_seed(1)
    classes = 10
    channels_last = layout == "channels_last"
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = Cnn(hidden, classes, channels_last).to(memory_format=fmt)
    model.train()  # batch statistics in BatchNorm, Dropout on, as in a training step
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    x = torch.rand(batch_size, 1, 28, 28).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch_size,))
    use_autocast = variant == "autocast_bfloat16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
            h = model.body(x)
        logits = model.logits(h.float())  # float32 logits layer, outside autocast
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):  # warm-up: Adam state, allocator, oneDNN primitives
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    weights = sum(p.numel() for p in model.parameters())
    emit({"what": "peer_torch_step", "model": "cnn", "variant": variant, "hidden": hidden,
          "batch_size": batch_size, "steps": steps, "ms_per_step": median * 1e3, "steps_per_second": 1.0 / median,
          "gflops": None, "layout": layout, "weights": weights})


def int_list(text):
    values = [int(v) for v in text.split(",")]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("expected positive integers separated by commas")
    return values


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("matmul")
    m.add_argument("--sizes", type=int_list, default=[512, 1024, 2048])
    m.add_argument("--seconds", type=float, default=1.0)
    m.add_argument("--threads", type=int, default=2)
    s = sub.add_parser("step")
    s.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    s.add_argument("--variant", choices=["float32", "autocast_bfloat16"], required=True)
    s.add_argument("--hidden", type=int_list, default=None,
                   help="MLP: hidden widths (default 4096,4096); cnn: the Dense width (default 128)")
    s.add_argument("--layout", choices=["channels_last", "nchw"], default="channels_last", help="cnn only")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.threads < 1:
        p.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    emit({"what": "peer_torch_info", "version": torch.__version__, "threads": torch.get_num_threads(),
          "mkldnn": torch.backends.mkldnn.is_available(), "blas": loaded_blas()})
    if args.what == "matmul":
        if not args.seconds > 0:
            p.error("--seconds must be positive")
        bench_matmul(args.sizes, args.seconds)
    else:
        if args.steps < 1 or args.batch_size < 1:
            p.error("--steps and --batch-size must be positive")
        if args.model == "cnn":
            hidden = args.hidden or [128]
            if len(hidden) != 1:
                p.error("--hidden takes one width for --model cnn")
            bench_cnn_step(args.variant, hidden[0], args.batch_size, args.steps, args.layout)
        else:
            bench_step(args.variant, args.hidden or [4096, 4096], args.batch_size, args.steps)


if __name__ == "__main__":
    main()
