#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU where the CUDA toolkit, CMake, ninja and PyTorch with CUDA are
# present and nothing else can be installed. Builds the CUDA backend with every core (build-gpu), runs its tests
# with a GPU required (a skip is a failure), then times the loss-scaling step of mixtrain and of PyTorch AMP
# (torch._amp_foreach_non_finite_check_and_unscale_ and torch._amp_update_scale_, what GradScaler runs) on the
# same sizes in one run, runs `mixtrain bench gemm --device cuda` (float32, float16 and bfloat16 GEMMs through the
# backend's cuBLASLt matmul) and `mixtrain doctor` (each GPU's GEMM measured, with its verdicts), and writes a JSON
# summary; then trains on the GPU: `mixtrain bench step --device cuda` for the MLP, CNN and transformer under each
# policy beside PyTorch AMP's same steps (with peak memory), and `mixtrain train --device cuda` against
# `--device cpu` on a small CSV. Well under 8 minutes. (PyTorch unscales 16-bit gradients in place, in 16 bits; mixtrain unscales them
# into float32, where small ones cannot underflow: it moves 4 more bytes per element.)
#
#   bash scripts/gpu-check.sh [--out DIR]     (default DIR: ./gpu-check-out, or $OUT when set)
#
# What the GPU backend covers is listed in docs/ARCHITECTURE.md; the tests below (the CudaBackend, CudaSharedMath,
# Cast and GemmTiming suites, and the Doctor suite with every GPU measured) check every CUDA kernel against the
# CPU's, layer normalization, the embedding, the CNN ops (pooling, batch normalization, conv2d:
# tests/ops/cuda_cnn_test.cpp), the losses, sum/mean, the accuracy and the counted unscale
# (tests/ops/cuda_losses_test.cpp), attention and the backward passes given a gradient of another dtype
# (tests/ops/cuda_attention_test.cpp), the fused optimizer update (SGD, RMSprop, Adam, AdamW) of a GPU parameter
# arena (bit for bit against the CPU optimizer) and the timed GEMM of `bench gemm --device` and doctor (tests/ops/cuda_gemm_timing_test.cpp) included.
# Without GoogleTest (the tests' framework) the tests are left out and mixtrain_gpu_bench's own check against the
# CPU bits decides.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
if [[ "${1:-}" == "--out" ]]; then out="${2:?--out needs a directory}"; fi
mkdir -p "$out"
log="$out/gpu-check.log"
: > "$log"
say() { echo "gpu-check: $*" | tee -a "$log"; }

tests=ON
if ! { [ -e /usr/include/gtest/gtest.h ] || [ -e /usr/local/include/gtest/gtest.h ]; }; then
  tests=OFF
  say "GoogleTest not found: building without the tests (mixtrain_gpu_bench checks the kernels against the CPU)"
fi
say "configuring build-gpu (MIXTRAIN_CUDA=ON, tests $tests)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTRAIN_CUDA=ON -DMIXTRAIN_TESTS="$tests" \
  -DMIXTRAIN_BENCH=OFF -DMIXTRAIN_MPI=OFF >> "$log" 2>&1 || { say "configure failed (see $log)"; tail -20 "$log"; exit 1; }
targets="mixtrain_gpu_bench mixtrain_cli"
[ "$tests" = ON ] && targets="$targets ops_test precision_test device_training_test"
# shellcheck disable=SC2086  # a list of target names
ninja -C build-gpu -j "$(nproc)" $targets >> "$log" 2>&1 || { say "build failed (see $log)"; tail -30 "$log"; exit 1; }

status=0
if [ "$tests" = ON ]; then
  say "GPU tests (MIXTRAIN_REQUIRE_GPU=1)"
  if ! MIXTRAIN_REQUIRE_GPU=1 build-gpu/tests/ops/ops_test \
         --gtest_filter='CudaBackend.*:CudaSharedMath.*:Cast.*:KernelTable.*:GemmTiming.*' \
         --gtest_output="json:$out/gpu-tests.json" >> "$log" 2>&1; then
    say "GPU tests FAILED"
    status=1
  fi
  say "training on a device (the emulated GPU's tests, in the GPU build)"
  if ! build-gpu/tests/train/device_training_test --gtest_output="json:$out/device-training-tests.json" >> "$log" 2>&1; then
    say "device training tests FAILED"
    status=1
  fi
  say "doctor tests (MIXTRAIN_REQUIRE_GPU=1: every GPU measured)"
  if ! MIXTRAIN_REQUIRE_GPU=1 build-gpu/tests/precision/precision_test --gtest_filter='Doctor.*' \
         --gtest_output="json:$out/doctor-tests.json" >> "$log" 2>&1; then
    say "doctor tests FAILED"
    status=1
  fi
fi

say "mixtrain bench gemm --device cuda: float32, float16, bfloat16 GEMMs through the backend's cuBLASLt matmul"
if ! build-gpu/tools/cli/mixtrain bench gemm --device cuda --sizes 1024,4096,8192 --seconds 0.5 \
       --json "$out/bench-gemm-gpu.json" 2>> "$log" | tee -a "$log"; then
  say "bench gemm --device cuda FAILED"
  status=1
fi
say "mixtrain doctor: the CPU and each GPU measured, with verdicts"
if ! build-gpu/tools/cli/mixtrain doctor --seconds 0.5 --json "$out/doctor.json" 2>> "$log" | tee -a "$log"; then
  say "doctor FAILED"
  status=1
fi

say "mixtrain bench step --device cuda: MLP, CNN and transformer training steps under each policy"
for model in mlp cnn transformer; do
  for policy in float32 mixed_float16 mixed_bfloat16; do
    if ! build-gpu/tools/cli/mixtrain bench step --device cuda --model "$model" --policy "$policy" --steps 20 \
           --json "$out/step-$model-$policy.json" 2>> "$log" | tee -a "$log"; then
      say "bench step --device cuda --model $model --policy $policy FAILED"
      status=1
    fi
  done
done

say "mixtrain train --device cuda against --device cpu: the CLI end to end on a small CSV"
python3 - "$out/teacher.csv" <<'PY'
import random, sys
random.seed(1)
w = [[random.gauss(0, 1) for _ in range(32)] for _ in range(5)]
with open(sys.argv[1], "w") as f:
    f.write(",".join(f"x{i}" for i in range(32)) + ",label\n")
    for _ in range(6000):
        x = [random.gauss(0, 1) for _ in range(32)]
        scores = [sum(a * b for a, b in zip(row, x)) for row in w]
        f.write(",".join(f"{v:.5f}" for v in x) + f",{scores.index(max(scores))}\n")
PY
for device in cpu cuda; do
  if ! build-gpu/tools/cli/mixtrain train --device "$device" --data "$out/teacher.csv" --hidden 64 --epochs 3 \
         --policy mixed_float16 --seed 1 --json "$out/train-$device.json" >> "$log" 2>&1; then
    say "train --device $device FAILED"
    status=1
  fi
done

say "mixtrain: check against the CPU, then time the loss-scaling step"
if ! build-gpu/tools/gpu_bench/mixtrain_gpu_bench 200 > "$out/mixtrain.jsonl" 2>> "$log"; then
  say "mixtrain_gpu_bench FAILED"
  status=1
fi

say "PyTorch AMP: the MLP, CNN and transformer training steps of bench step (autocast, GradScaler for float16)"
python3 - > "$out/torch-steps.jsonl" 2>> "$log" <<'PY' || { say "PyTorch training steps FAILED"; status=1; }
import json, time, torch
from torch import nn
dev = "cuda"
def mlp():
    return nn.Sequential(nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
def cnn():  # tools' model zoo: two Conv-BN-ReLU-MaxPool stages, Dense 128, dropout, logits
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                         nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10))
class Block(nn.Module):  # the tools' transformer block: pre-LN, causal attention, 4x GELU MLP
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2, self.heads = nn.LayerNorm(d), nn.LayerNorm(d), heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, h):
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln_1(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(nn.functional, "scaled_dot_product_attention"):
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0
            mask = torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1)
            w = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
            a = w.masked_fill(mask, float("-inf")).softmax(-1) @ v
        a = a.transpose(1, 2).reshape(b, t, d)
        h = h + self.out(a)
        return h + self.mlp(self.ln_2(h))
class LM(nn.Module):  # bench step's transformer defaults: V 83, T 64, D 128, 2 layers, 4 heads
    def __init__(self, v=83, t=64, d=128, layers=2, heads=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(v, d), nn.Parameter(torch.zeros(t, d))
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, v)
    def forward(self, ids):
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos)))
for name, make in (("mlp", mlp), ("cnn", cnn), ("transformer", LM)):
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        torch.manual_seed(1)
        model = make().to(dev)
        lm = name == "transformer"
        # bench step's recipes: Adam 1e-3; the transformer's AdamW 2e-3, weight decay 0.01, clipping at norm 1.
        opt = (torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01) if lm
               else torch.optim.Adam(model.parameters(), lr=1e-3))
        dtype = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(policy)
        try:
            scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
        except (AttributeError, TypeError):  # PyTorch before 2.3
            scaler = torch.cuda.amp.GradScaler(enabled=dtype is torch.float16)
        if lm:
            x = torch.randint(0, 83, (32, 64), device=dev)
            y = torch.randint(0, 83, (32, 64), device=dev)
        else:
            x = torch.rand(256, 784, device=dev)
            y = torch.randint(0, 10, (256,), device=dev)
        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                out = model(x)
                loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
            scaler.scale(loss).backward()
            if lm:
                scaler.unscale_(opt)
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            return loss.item()  # read back each step, as mixtrain's bench step does
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(20):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        times.sort()
        print(json.dumps({"model": name, "policy": policy, "ms_per_step": 1e3 * times[len(times) // 2],
                          "step_peak_memory_bytes": torch.cuda.max_memory_allocated() - base}))
PY

say "PyTorch AMP: the same loss-scaling step"
python3 - > "$out/torch.jsonl" 2>> "$log" <<'PY' || { say "PyTorch step FAILED"; status=1; }
import json, time, torch
assert torch.cuda.is_available(), "PyTorch sees no GPU"
print(json.dumps({"what": "torch", "version": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))
for dtype, name in ((torch.float32, "float32"), (torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
    for n in (1 << 20, 1 << 24, 1 << 27):
        g = torch.full((n,), 0.5, dtype=dtype, device="cuda")
        scale = torch.full((1,), 32768.0, device="cuda")
        inv = torch.full((1,), 1.0 / 32768.0, device="cuda")
        found = torch.zeros(1, device="cuda")
        growth = torch.zeros(1, dtype=torch.int32, device="cuda")
        def step():
            found.zero_()
            torch._amp_foreach_non_finite_check_and_unscale_([g], found, inv)
            torch._amp_update_scale_(scale, growth, found, 2.0, 0.5, 2000)
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        steps = 200
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        print(json.dumps({"what": "torch_unscale_step", "dtype": name, "n": n, "us_per_step": 1e6 * s / steps}))
PY

python3 - "$out" <<'PY' | tee -a "$log"
import json, sys, os
out = sys.argv[1]
def lines(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
mx = {(r["dtype"], r["n"]): r for r in lines("mixtrain.jsonl") if r["what"] == "mixtrain_unscale_step"}
checks = [r for r in lines("mixtrain.jsonl") if r["what"] == "mixtrain_unscale_check"]
pt = {(r["dtype"], r["n"]): r for r in lines("torch.jsonl") if r["what"] == "torch_unscale_step"}
rows = []
print("loss-scaling step (unscale + check + scale update), us per step; speedup = PyTorch / mixtrain")
for key in sorted(mx):
    m, p = mx[key], pt.get(key)
    ratio = p["us_per_step"] / m["us_per_step"] if p else None
    rows.append({"dtype": key[0], "n": key[1], "mixtrain_us": m["us_per_step"],
                 "torch_us": p["us_per_step"] if p else None, "speedup_vs_torch": ratio})
    print(f"{key[0]:>9} n={key[1]:>10}  mixtrain {m['us_per_step']:9.1f}  torch "
          f"{(p['us_per_step'] if p else float('nan')):9.1f}  {('%.2fx' % ratio) if ratio else 'n/a'}")
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
gemm = load("bench-gemm-gpu.json")
doctor = load("doctor.json")
gpu_gemm = gemm["gemm"] if gemm else None
gpu_doctor = None
if doctor:
    gpu_doctor = {"gpus": [dict(d.get("gemm", {}), name=d["name"]) for d in doctor["gpus"]["devices"]],
                  "verdicts": [v for v in doctor["verdicts"] if v["device"] != "cpu"]}
    for v in gpu_doctor["verdicts"]:
        print(f"doctor {v['device']} {v['policy']}: {v['verdict']}")
torch_steps = {(r["model"], r["policy"]): r for r in lines("torch-steps.jsonl")}
train_steps = []
print("training steps on the GPU, ms per step (batch 256; transformer: bench step's defaults); "
      "vs torch = PyTorch / mixtrain, vs float32 = mixtrain float32 / mixtrain")
for model in ("mlp", "cnn", "transformer"):
    f32 = load(f"step-{model}-float32.json")
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        m = load(f"step-{model}-{policy}.json")
        if not m:
            continue
        t = torch_steps.get((model, policy))
        row = {"model": model, "policy": policy, "mixtrain_ms": m["ms_per_step"],
               "mixtrain_step_peak_bytes": m.get("step_peak_memory_bytes"),
               "torch_ms": t["ms_per_step"] if t else None,
               "torch_step_peak_bytes": t["step_peak_memory_bytes"] if t else None,
               "speedup_vs_torch": t["ms_per_step"] / m["ms_per_step"] if t else None,
               "speedup_vs_float32": f32["ms_per_step"] / m["ms_per_step"] if f32 else None,
               # The step's peak beyond what stays resident, over the float32 step's (target for the mixed
               # transformer: at most 0.6).
               "step_peak_vs_float32": (m["step_peak_memory_bytes"] / f32["step_peak_memory_bytes"]
                                        if f32 and f32.get("step_peak_memory_bytes") else None)}
        train_steps.append(row)
        print(f"{model:>11} {policy:>14}  mixtrain {row['mixtrain_ms']:8.2f}  torch "
              f"{(row['torch_ms'] or float('nan')):8.2f}  vs torch "
              f"{('%.2fx' % row['speedup_vs_torch']) if row['speedup_vs_torch'] else 'n/a'}  vs float32 "
              f"{('%.2fx' % row['speedup_vs_float32']) if row['speedup_vs_float32'] else 'n/a'}  step peak vs float32 "
              f"{('%.2f' % row['step_peak_vs_float32']) if row['step_peak_vs_float32'] else 'n/a'}")
train_cli = {}
for device in ("cpu", "cuda"):
    r = load(f"train-{device}.json")
    if r:
        train_cli[device] = {"test": r["test"], "first_step_loss": r["step_loss"][0], "last_step_loss": r["step_loss"][-1],
                             "peak_memory_bytes": r["peak_memory_bytes"]}
if len(train_cli) == 2:
    gap = abs(train_cli["cpu"]["test"]["accuracy"] - train_cli["cuda"]["test"]["accuracy"])
    train_cli["accuracy_gap"] = gap
    print(f"train --device cuda vs cpu: test accuracy {train_cli['cuda']['test']['accuracy']:.4f} vs "
          f"{train_cli['cpu']['test']['accuracy']:.4f}, first step loss {train_cli['cuda']['first_step_loss']:.6f} vs "
          f"{train_cli['cpu']['first_step_loss']:.6f}")
summary = {"checks": checks, "steps": rows, "gemm": gpu_gemm, "doctor": gpu_doctor, "train_steps": train_steps,
           "train_cli": train_cli}
json.dump(summary, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)
print("bit-identical to the CPU:", all(c["bit_identical"] for c in checks) if checks else "not run")
PY
say "summary in $out/gpu-check.json (exit $status)"
exit "$status"
