#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU where the CUDA toolkit, CMake, ninja and PyTorch with CUDA are
# present and nothing else can be installed. Builds the CUDA backend with every core (build-gpu), runs its tests
# with a GPU required (a skip is a failure), then times the loss-scaling step of mixtrain and of PyTorch AMP
# (torch._amp_foreach_non_finite_check_and_unscale_ and torch._amp_update_scale_, what GradScaler runs) on the
# same sizes in one run, runs `mixtrain bench gemm --device cuda` (float32, float16 and bfloat16 GEMMs through the
# backend's cuBLASLt matmul) and `mixtrain doctor` (each GPU's GEMM measured, with its verdicts), and writes a JSON
# summary. Well under 8 minutes. (PyTorch unscales 16-bit gradients in place, in 16 bits; mixtrain unscales them
# into float32, where small ones cannot underflow: it moves 4 more bytes per element.)
#
#   bash scripts/gpu-check.sh [--out DIR]     (default DIR: ./gpu-check-out, or $OUT when set)
#
# What the GPU backend covers is listed in docs/ARCHITECTURE.md; the tests below (the CudaBackend, CudaSharedMath,
# Cast and GemmTiming suites, and the Doctor suite with every GPU measured) check every CUDA kernel against the
# CPU's, layer normalization, the embedding, the CNN ops (pooling, batch normalization, conv2d:
# tests/ops/cuda_cnn_test.cpp), the losses, sum/mean, the accuracy and the counted unscale
# (tests/ops/cuda_losses_test.cpp), attention and the backward passes given a gradient of another dtype
# (tests/ops/cuda_attention_test.cpp), the fused Adam update of a GPU parameter arena (bit for bit against the CPU
# optimizer) and the timed GEMM of `bench gemm --device` and doctor (tests/ops/cuda_gemm_timing_test.cpp) included.
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
[ "$tests" = ON ] && targets="$targets ops_test precision_test"
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

say "mixtrain: check against the CPU, then time the loss-scaling step"
if ! build-gpu/tools/gpu_bench/mixtrain_gpu_bench 200 > "$out/mixtrain.jsonl" 2>> "$log"; then
  say "mixtrain_gpu_bench FAILED"
  status=1
fi

say "PyTorch AMP: the same step"
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
summary = {"checks": checks, "steps": rows, "gemm": gpu_gemm, "doctor": gpu_doctor}
json.dump(summary, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)
print("bit-identical to the CPU:", all(c["bit_identical"] for c in checks) if checks else "not run")
PY
say "summary in $out/gpu-check.json (exit $status)"
exit "$status"
