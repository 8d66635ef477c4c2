#!/usr/bin/env python3
"""PyTorch at the same work `mixtrain bench` measures, on the CPU or a GPU, for side-by-side ratios.

  peer_torch.py matmul [--sizes 512,1024,2048] [--seconds S] [--threads T] [--device cpu|cuda|cuda:N]
      C = A @ B, all n x n in the dtype under test; best of repeated runs over about S seconds per case. On a
      GPU, as `mixtrain bench gemm --device` times it: batches of back-to-back products (about 10 ms each)
      between synchronizations, the fastest batch per product; float32 with TF32 off (mixtrain's default).
  peer_torch.py step --variant float32|autocast_bfloat16|autocast_float16 [--hidden 4096,4096]
                     [--batch-size 256] [--steps N] [--threads T] [--device cpu|cuda|cuda:N]
      One training step of the MLP `mixtrain bench step` builds: 784-H1-H2-10, ReLU, Adam (lr 1e-3, eps 1e-7 as Keras),
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
  peer_torch.py step --model transformer --variant float32|autocast_bfloat16 [--vocabulary 83] [--context 64]
                     [--width 128] [--layers 2] [--heads 4] [--batch-size 32] [--steps N] [--threads T]
      One training step of the decoder-only transformer `mixtrain bench step --model transformer` builds
      (src/train/transformer_model.cpp), written out in modules: ids (B, T) -> Embedding(V, D) + learned
      positions (T, D) -> L x [LayerNorm(eps 1e-3) -> causal multi-head self-attention (q, k, v and output
      projections with bias, softmax(QK^T / sqrt(D / H)) in float32) -> add; LayerNorm -> Linear(4D) + exact
      (erf) GELU -> Linear(D) -> add] -> LayerNorm -> Linear(V) float32 logits; cross-entropy averaged over
      B x T; AdamW (lr 2e-3, weight decay 0.01 on weights and embeddings, none on biases and LayerNorm, eps
      1e-7 as Keras), clip_grad_norm_ 1.0, the cosine schedule with linear warm-up `mixtrain train --model
      transformer` uses (over the warm-up and timed steps). Random ids in [0, V), labelled with the next id.
      Under autocast_bfloat16 the logits Linear runs outside autocast, in float32, as mixtrain's does.

On a GPU (--device cuda) every step reads its loss back (loss.item()), as `mixtrain bench step` reads each step's
logs, so a step's time covers its GPU work; autocast_float16 (GPU only: PyTorch's CPU autocast has no float16) adds
GradScaler's dynamic loss scaling (from mixtrain's initial scale, 2^15), the transformer's unscaling before clipping
included; each record gives step_peak_memory_bytes, the peak allocated during the timed steps beyond what was
allocated before them, and skipped_steps, the optimizer steps GradScaler skipped. On a GPU the peer runs as its users
would at their fastest: Adam and AdamW with fused=True (optimizer_impl "fused"), the transformer's attention through
F.scaled_dot_product_attention (attention "sdpa"); on the CPU the default optimizer and the written-out attention.

Prints one JSON object per line. GFLOP/s of an MLP step counts 6 x batch x weights (forward 2, backward 4),
as mixtrain does; a convolution reuses its weights across positions and attention multiplies activations by
activations, so for the CNN and the transformer it is null, as mixtrain prints none.
"""
import argparse
import json
import math
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
AUTOCAST = {"float32": None, "autocast_bfloat16": torch.bfloat16, "autocast_float16": torch.float16}


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


class Target:
    """Where the peer runs: its device, how to wait for the work queued there, and its memory counters."""

    def __init__(self, name):
        self.device = torch.device(name)
        self.gpu = self.device.type == "cuda"
        if self.gpu:
            if not torch.cuda.is_available():
                raise SystemExit(f"peer_torch: --device {name}: PyTorch sees no GPU (torch {torch.__version__})")
            if self.device.index is None:  # "cuda": the current GPU, by index (set_device wants one)
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
            # mixtrain multiplies float32 in float32 unless told otherwise (MIXTRAIN_CUDA_TF32=1): so does the peer.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

    def sync(self):
        if self.gpu:
            torch.cuda.synchronize(self.device)

    def info(self):
        return {"device": str(self.device),
                "gpu": torch.cuda.get_device_name(self.device) if self.gpu else None,
                "tf32": torch.backends.cuda.matmul.allow_tf32 if self.gpu else None}


class Mixed:
    """autocast on the target's device for a 16-bit variant, and GradScaler's dynamic loss scaling for float16."""

    def __init__(self, target, variant):
        self.dtype = AUTOCAST[variant]
        self.device_type = target.device.type
        if self.dtype is torch.float16 and not target.gpu:
            raise ValueError("peer_torch: autocast_float16 runs on a GPU only (PyTorch's CPU autocast has no float16)")
        scaled = self.dtype is torch.float16
        # mixtrain's LossScaleOptimizer starts at 2^15 (Keras' default) and doubles after 2000 finite steps, as
        # GradScaler does; GradScaler starts at 2^16, which would skip more early steps (each skipped step is cheap).
        try:
            self.scaler = torch.amp.GradScaler(self.device_type, init_scale=32768.0, enabled=scaled)
        except (AttributeError, TypeError):  # PyTorch before 2.3
            self.scaler = torch.cuda.amp.GradScaler(init_scale=32768.0, enabled=scaled)

    def autocast(self):
        # A disabled autocast still names a dtype its device supports, or PyTorch warns.
        fallback = torch.float16 if self.device_type == "cuda" else torch.bfloat16
        return torch.autocast(self.device_type, dtype=self.dtype or fallback, enabled=self.dtype is not None)

    def backward_and_step(self, loss, opt, clip_params=None):
        self.scaler.scale(loss).backward()
        if clip_params is not None:
            self.scaler.unscale_(opt)  # clipping sees the true gradients (a no-op without scaling)
            torch.nn.utils.clip_grad_norm_(clip_params, 1.0)
        self.scaler.step(opt)  # skipped when a gradient is not finite
        self.scaler.update()


def make_optimizer(cls, params, target, **options):
    """Adam or AdamW as a PyTorch user on this device gets it at its fastest: on a GPU the fused kernel (one launch
    over every parameter, as mixtrain's fused update over its parameter arena; PyTorch 2.0 and later), else the
    default. Returns the optimizer and its implementation's name, which each record carries."""
    if target.gpu:
        try:
            return cls(params, fused=True, **options), "fused"
        except (TypeError, RuntimeError):  # a PyTorch without the fused kernel for these parameters
            pass
    return cls(params, **options), "default"


def skipped_steps(opt, calls):
    """How many of `calls` optimizer steps GradScaler skipped for a non-finite gradient: Adam counts only the
    steps it took."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            if "step" in state:
                return calls - int(float(state["step"]))
    return calls


def time_steps(step, steps, warmup, target):
    """The median of `steps` timed calls of step() after `warmup` untimed ones (optimizer state, allocator,
    kernels chosen), and on a GPU the peak allocated beyond what was allocated before the timed steps."""
    for _ in range(warmup):
        step()
    target.sync()
    base = None
    if target.gpu:
        torch.cuda.reset_peak_memory_stats(target.device)
        base = torch.cuda.memory_allocated(target.device)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step().item()  # the loss read back: on a GPU, the wait for the step's work
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated(target.device) - base if target.gpu else None
    return statistics.median(times), peak


def bench_matmul(sizes, seconds, target):
    gen = torch.Generator().manual_seed(1)
    for n in sizes:
        a32 = torch.rand(n, n, generator=gen) * 2 - 1
        b32 = torch.rand(n, n, generator=gen) * 2 - 1
        for name, dtype in DTYPES.items():
            a, b = a32.to(dtype).to(target.device), b32.to(dtype).to(target.device)
            c = torch.empty(n, n, dtype=dtype, device=target.device)
            try:
                torch.mm(a, b, out=c)  # untimed: first touch, and fails here if not implemented
                target.sync()
            except RuntimeError as e:
                emit({"what": "peer_torch_matmul", "n": n, "dtype": name, "supported": False,
                      "reason": str(e).splitlines()[0], "device": str(target.device)})
                continue
            # Products per timed batch: one on the CPU; on a GPU about 10 ms of them back to back, so the launch
            # cost overlaps the work, as mixtrain's time_matmul batches them.
            per_batch = 1
            if target.gpu:
                t = time.perf_counter()
                torch.mm(a, b, out=c)
                target.sync()
                one = max(time.perf_counter() - t, 1e-7)
                per_batch = int(min(max(min(0.01, seconds / 4) / one, 1), 1000))
            best, runs, start = float("inf"), 0, time.perf_counter()
            while runs < 2 or (time.perf_counter() - start < seconds and runs < 1000):
                target.sync()
                t = time.perf_counter()
                for _ in range(per_batch):
                    torch.mm(a, b, out=c)
                target.sync()
                best = min(best, (time.perf_counter() - t) / per_batch)
                runs += 1
            emit({"what": "peer_torch_matmul", "n": n, "dtype": name, "supported": True,
                  "gflops": 2.0 * n ** 3 / best / 1e9, "runs": runs, "per_batch": per_batch,
                  "device": str(target.device)})


def bench_step(variant, hidden, batch_size, steps, target):
    torch.manual_seed(1)
    inputs, classes = 784, 10  # the Fashion-MNIST shapes, as in mixtrain bench step
    layers, width = [], inputs
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    body = torch.nn.Sequential(*layers).to(target.device)
    # The read-out in float32, outside autocast, as mixtrain's MLP keeps its last Dense (dtype="float32").
    head = torch.nn.Linear(width, classes).to(target.device)
    model = torch.nn.Sequential(body, head)
    opt, impl = make_optimizer(torch.optim.Adam, model.parameters(), target, lr=1e-3, eps=1e-7)  # eps as Keras
    x = torch.rand(batch_size, inputs, device=target.device)
    y = torch.randint(0, classes, (batch_size,), device=target.device)
    mixed = Mixed(target, variant)

    def step():
        opt.zero_grad(set_to_none=True)
        with mixed.autocast():
            h = body(x)
        loss = F.cross_entropy(head(h.float()), y)
        mixed.backward_and_step(loss, opt)
        return loss

    median, peak = time_steps(step, steps, 2, target)  # warm-up: Adam state, allocator
    weights = sum(p.numel() for p in model.parameters())
    emit({"what": "peer_torch_step", "model": "mlp", "variant": variant, "hidden": hidden, "optimizer_impl": impl,
          "skipped_steps": skipped_steps(opt, steps + 2),
          "batch_size": batch_size, "steps": steps, "ms_per_step": median * 1e3, "steps_per_second": 1.0 / median,
          "gflops": 6.0 * batch_size * weights / median / 1e9, "weights": weights, "device": str(target.device),
          "step_peak_memory_bytes": peak})


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


def bench_cnn_step(variant, hidden, batch_size, steps, layout, target):
    torch.manual_seed(1)
    classes = 10
    channels_last = layout == "channels_last"
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = Cnn(hidden, classes, channels_last).to(target.device, memory_format=fmt)
    model.train()  # batch statistics in BatchNorm, Dropout on, as in a training step
    opt, impl = make_optimizer(torch.optim.Adam, model.parameters(), target, lr=1e-3, eps=1e-7)
    x = torch.rand(batch_size, 1, 28, 28, device=target.device).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch_size,), device=target.device)
    mixed = Mixed(target, variant)

    def step():
        opt.zero_grad(set_to_none=True)
        with mixed.autocast():
            h = model.body(x)
        logits = model.logits(h.float())  # float32 logits layer, outside autocast
        loss = F.cross_entropy(logits, y)
        mixed.backward_and_step(loss, opt)
        return loss

    median, peak = time_steps(step, steps, 2, target)  # warm-up: Adam state, allocator, oneDNN/cuDNN choices
    weights = sum(p.numel() for p in model.parameters())
    emit({"what": "peer_torch_step", "model": "cnn", "variant": variant, "hidden": hidden, "optimizer_impl": impl,
          "skipped_steps": skipped_steps(opt, steps + 2),
          "batch_size": batch_size, "steps": steps, "ms_per_step": median * 1e3, "steps_per_second": 1.0 / median,
          "gflops": None, "layout": layout, "weights": weights, "device": str(target.device),
          "step_peak_memory_bytes": peak})


class CausalSelfAttention(torch.nn.Module):
    """Keras-style MultiHeadAttention with causal=True, as mixtrain's: separate q, k, v projections with bias,
    softmax in float32, an output projection with bias. With fused=True the scores, mask, softmax and product are
    F.scaled_dot_product_attention(is_causal=True), as a PyTorch user on a GPU writes it (its kernels keep the
    softmax in float32 too); else the written-out form, the only one PyTorch before 2.0 has."""

    def __init__(self, width, heads, context, fused=False):
        super().__init__()
        self.fused = fused
        self.heads, self.head_size = heads, width // heads
        self.query = torch.nn.Linear(width, width)
        self.key = torch.nn.Linear(width, width)
        self.value = torch.nn.Linear(width, width)
        self.output = torch.nn.Linear(width, width)
        # True above the diagonal: position t attends to positions <= t only.
        self.register_buffer("future", torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1))

    def forward(self, x):  # x: (B, T, D)
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.heads, self.head_size).transpose(1, 2)  # (B, H, T, dk)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.fused:  # the default scale, 1 / sqrt(dk), as below
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
            return self.output(out)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))  # (B, H, T, T)
        scores = scores.masked_fill(self.future[:T, :T], float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)  # float32 softmax, as mixtrain
        out = (probs @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.output(out)


class Block(torch.nn.Module):
    """Pre-LayerNorm: x + attention(LN(x)), then h + mlp(LN(h))."""

    def __init__(self, width, heads, context, fused_attention):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(width, eps=1e-3)
        self.attention = CausalSelfAttention(width, heads, context, fused_attention)
        self.ln_2 = torch.nn.LayerNorm(width, eps=1e-3)
        self.mlp_in = torch.nn.Linear(width, 4 * width)
        self.mlp_out = torch.nn.Linear(4 * width, width)

    def forward(self, x):  # (B, T, D) -> (B, T, D)
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.ln_2(x))))  # exact (erf) GELU, PyTorch's default


class TransformerLM(torch.nn.Module):
    """The transformer of mixtrain's model zoo (src/train/transformer_model.cpp), dropout 0."""

    def __init__(self, vocabulary, context, width, layers, heads, fused_attention):
        super().__init__()
        self.token_embedding = torch.nn.Embedding(vocabulary, width)
        self.position_embedding = torch.nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = torch.nn.ModuleList([Block(width, heads, context, fused_attention) for _ in range(layers)])
        self.final_ln = torch.nn.LayerNorm(width, eps=1e-3)
        self.logits = torch.nn.Linear(width, vocabulary)

    def body(self, ids):  # ids: (B, T) int
        h = self.token_embedding(ids) + self.position_embedding[: ids.shape[1]]  # (B, T, D)
        for block in self.blocks:
            h = block(h)
        return self.final_ln(h)  # (B, T, D)


def cosine_with_warmup(total_steps):
    """The factor on the learning rate at each step of mixtrain's make_schedule("cosine", lr, total, warmup)
    with train's warm-up of a tenth of the run (at most 100 steps): linear from 0, then cosine down to 0.1."""
    warmup = min(100, total_steps // 10)
    decay = max(1, total_steps - warmup)

    def factor(step):
        if step < warmup:
            return step / warmup
        fraction = (min(step, warmup + decay) - warmup) / decay
        return 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)) + 0.1

    return factor


def bench_transformer_step(variant, vocabulary, context, width, layers, heads, batch_size, steps, target):
    torch.manual_seed(1)
    # On a GPU, PyTorch's fused attention where this PyTorch has it: the peer at its fastest.
    fused_attention = target.gpu and hasattr(F, "scaled_dot_product_attention")
    model = TransformerLM(vocabulary, context, width, layers, heads, fused_attention).to(target.device)
    model.train()
    # Weight decay on the weights and embeddings; none on biases and LayerNorm gains and offsets, as mixtrain's
    # AdamW excludes variables named bias, gamma and beta.
    no_decay = {id(m.bias) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm))}
    no_decay |= {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    params = list(model.parameters())
    groups = [{"params": [p for p in params if id(p) not in no_decay], "weight_decay": 0.01},
              {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0}]
    opt, impl = make_optimizer(torch.optim.AdamW, groups, target, lr=2e-3, eps=1e-7)
    warmup_steps = 2
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, cosine_with_warmup(steps + warmup_steps))
    stream = torch.randint(0, vocabulary, (batch_size * context + 1,)).to(target.device)
    x = stream[:-1].view(batch_size, context)  # (B, T)
    y = stream[1:].view(batch_size, context)  # (B, T): the id after each position
    mixed = Mixed(target, variant)

    def step():
        opt.zero_grad(set_to_none=True)
        with mixed.autocast():
            h = model.body(x)
        logits = model.logits(h.float())  # (B, T, V) float32 logits layer, outside autocast
        loss = F.cross_entropy(logits.reshape(-1, vocabulary), y.reshape(-1))  # mean over B x T
        mixed.backward_and_step(loss, opt, clip_params=params)
        schedule.step()
        return loss

    # warm-up: AdamW state, allocator, oneDNN/cuBLAS choices
    median, peak = time_steps(step, steps, warmup_steps, target)
    emit({"what": "peer_torch_step", "model": "transformer", "variant": variant, "vocabulary": vocabulary,
          "optimizer_impl": impl, "attention": "sdpa" if fused_attention else "written out",
          "skipped_steps": skipped_steps(opt, steps + warmup_steps),
          "context": context, "width": width, "layers": layers, "heads": heads, "batch_size": batch_size,
          "steps": steps, "ms_per_step": median * 1e3, "steps_per_second": 1.0 / median,
          "tokens_per_second": batch_size * context / median, "gflops": None,
          "weights": sum(p.numel() for p in params), "device": str(target.device),
          "step_peak_memory_bytes": peak})


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
    m.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    s = sub.add_parser("step")
    s.add_argument("--model", choices=["mlp", "cnn", "transformer"], default="mlp")
    s.add_argument("--variant", choices=list(AUTOCAST), required=True,
                   help="autocast_float16 (with GradScaler) on a GPU only")
    s.add_argument("--hidden", type=int_list, default=None,
                   help="MLP: hidden widths (default 4096,4096); cnn: the Dense width (default 128)")
    s.add_argument("--layout", choices=["channels_last", "nchw"], default="channels_last", help="cnn only")
    s.add_argument("--batch-size", type=int, default=None, help="default 256; transformer 32")
    for flag, default in (("vocabulary", 83), ("context", 64), ("width", 128), ("layers", 2), ("heads", 4)):
        s.add_argument(f"--{flag}", type=int, default=None, help=f"transformer only (default {default})")
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    args = p.parse_args()
    if args.threads < 1:
        p.error("--threads must be >= 1")
    try:
        target = Target(args.device)
    except RuntimeError as e:  # not a device name PyTorch knows
        p.error(f"--device {args.device}: {e}")
    if args.what == "step" and args.variant == "autocast_float16" and not target.gpu:
        p.error("--variant autocast_float16 needs --device cuda (PyTorch's CPU autocast has no float16)")
    torch.set_num_threads(args.threads)
    emit(dict({"what": "peer_torch_info", "version": torch.__version__, "threads": torch.get_num_threads(),
               "mkldnn": torch.backends.mkldnn.is_available(), "blas": loaded_blas()}, **target.info()))
    if args.what == "matmul":
        if not args.seconds > 0:
            p.error("--seconds must be positive")
        bench_matmul(args.sizes, args.seconds, target)
    else:
        shape_flags = ("vocabulary", "context", "width", "layers", "heads")
        if args.model != "transformer":
            given = [f for f in shape_flags if getattr(args, f) is not None]
            if given:
                p.error(f"--{given[0]} applies to --model transformer only")
        elif args.hidden is not None:
            p.error("--hidden does not apply to --model transformer (its MLP is 4 x --width)")
        if args.batch_size is None:
            args.batch_size = 32 if args.model == "transformer" else 256
        if args.steps < 1 or args.batch_size < 1:
            p.error("--steps and --batch-size must be positive")
        if args.model == "transformer":
            shape = {f: getattr(args, f) for f in shape_flags}
            for f, d in zip(shape_flags, (83, 64, 128, 2, 4)):
                shape[f] = d if shape[f] is None else shape[f]
                if shape[f] < 1:
                    p.error(f"--{f} must be positive")
            if shape["width"] % shape["heads"]:
                p.error(f"--heads {shape['heads']} must divide --width {shape['width']}")
            bench_transformer_step(args.variant, shape["vocabulary"], shape["context"], shape["width"],
                                   shape["layers"], shape["heads"], args.batch_size, args.steps, target)
        elif args.model == "cnn":
            hidden = args.hidden or [128]
            if len(hidden) != 1:
                p.error("--hidden takes one width for --model cnn")
            bench_cnn_step(args.variant, hidden[0], args.batch_size, args.steps, args.layout, target)
        else:
            bench_step(args.variant, args.hidden or [4096, 4096], args.batch_size, args.steps, target)


if __name__ == "__main__":
    main()
