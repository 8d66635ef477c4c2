#!/usr/bin/env bash
# scripts/gpu-check.sh end to end without a GPU: cmake, ninja and the binaries it runs are stand-ins (each writes the
# files its real counterpart writes, with made-up figures), so what is checked is the script's own flow, which a GPU
# machine runs once: every step reached, a failing step (here one bench step and one PyTorch case) reported and the
# rest still run, mixtrain and PyTorch given the same shapes and each step set beside PyTorch's record of its own,
# the exit status 1, and OUT holding the log, the summary with the figures the stand-ins wrote, and the archive of
# every step's files. A second run stops its stand-ins part way (as a device call's time limit
# would): the figures taken before the stop must already be in OUT. A third gives the whole run less time
# (GPU_CHECK_BUDGET) than its first step takes: the tests are not built, that step is cut, the rest are skipped, and
# the run ends in time.
# Usage: gpu_check_flow_test.sh REPO_ROOT
set -eu
root="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A copy of what the script reads: itself and its summary; the PyTorch peer is a stand-in.
mkdir -p "$tmp/repo/scripts" "$tmp/repo/bench" "$tmp/bin"
cp "$root/scripts/gpu-check.sh" "$root/scripts/gpu_check_summary.py" "$tmp/repo/scripts/"

# bench/peer_torch.py: a stand-in with the real one's functions (the script calls them from its own Python), each
# recording its call in calls.log and printing a record of the shape it was given, as the real one does. One case
# fails (the CNN under autocast float16), as a PyTorch case may: the others still run and the step is reported.
cat > "$tmp/repo/bench/peer_torch.py" <<'PY'
import json, os
torch = type("torch", (), {"__version__": "stand-in"})
class Target:
    def __init__(self, device):
        self.device = device
    def info(self):
        return {"device": self.device}
def called(*args):
    with open(os.environ["GPU_CHECK_FLOW_CALLS"], "a") as f:
        f.write("peer_torch " + " ".join(str(a) for a in args) + "\n")
def step_record(model, variant, batch_size, **shape):
    print(json.dumps(dict({"what": "peer_torch_step", "model": model, "variant": variant, "batch_size": batch_size,
                           "ms_per_step": batch_size / 8, "step_peak_memory_bytes": 1}, **shape)))
def bench_matmul(sizes, seconds, target):
    called("matmul", ",".join(str(n) for n in sizes))
    print(json.dumps({"what": "peer_torch_matmul", "n": 8192, "dtype": "bfloat16", "supported": True,
                      "gflops": 800000.0}))
def bench_step(variant, hidden, batch_size, steps, target):
    called("mlp", variant, "batch", batch_size)
    step_record("mlp", variant, batch_size)
def bench_cnn_step(variant, hidden, batch_size, steps, layout, target):
    called("cnn", variant, "batch", batch_size)
    if variant == "autocast_float16":
        raise RuntimeError("stand-in failure")
    step_record("cnn", variant, batch_size)
def bench_transformer_step(variant, vocabulary, context, width, layers, heads, batch_size, steps, target):
    called("transformer", variant, "vocabulary", vocabulary, "context", context, "width", width, "layers", layers,
           "heads", heads, "batch", batch_size)
    step_record("transformer", variant, batch_size, vocabulary=vocabulary, context=context, width=width,
                layers=layers, heads=heads)
PY

# cmake and ninja: the build's outputs, as stand-ins.
cat > "$tmp/bin/cmake" <<'SH'
#!/usr/bin/env bash
echo "cmake $*" >> "$GPU_CHECK_FLOW_CALLS"
echo "cmake (stand-in) $*"
SH
# The driver and the toolkit: nvidia-smi's table names the CUDA version the driver supports (GPU_CHECK_FLOW_DRIVER,
# default 13.0), nvcc its release (13.0).
cat > "$tmp/bin/nvidia-smi" <<'SH'
#!/usr/bin/env bash
[ $# -eq 0 ] && echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: ${GPU_CHECK_FLOW_DRIVER:-13.0}     |"
exit 0
SH
cat > "$tmp/bin/nvcc" <<'SH'
#!/usr/bin/env bash
echo "Cuda compilation tools, release 13.0, V13.0.48"
SH
cat > "$tmp/bin/ninja" <<'SH'
#!/usr/bin/env bash
# Makes build-gpu's binaries: each records its call in calls.log and writes what its real counterpart writes.
set -eu
if [ -n "${GPU_CHECK_FLOW_BUILD_FAILS:-}" ]; then echo "stand-in compile error" >&2; exit 1; fi
b=build-gpu
mkdir -p "$b/tests/ops" "$b/tests/train" "$b/tests/distributed" "$b/tests/precision" "$b/tools/cli" "$b/tools/gpu_bench"
for t in tests/ops/ops_test tests/train/device_training_test tests/train/gpu_training_test tests/distributed/nccl_api_test \
         tests/precision/precision_test; do
  cat > "$b/$t" <<'T'
#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$GPU_CHECK_FLOW_CALLS"
for a in "$@"; do case "$a" in --gtest_output=json:*) echo '{"tests": 1, "failures": 0}' > "${a#--gtest_output=json:}";; esac; done
if [ -n "${GPU_CHECK_FLOW_SLEEP:-}" ] && [ "$(basename "$0")" = "$GPU_CHECK_FLOW_SLEEP" ]; then sleep 60; fi
T
done
cat > "$b/tools/cli/mixtrain" <<'T'
#!/usr/bin/env bash
echo "mixtrain $*" >> "$GPU_CHECK_FLOW_CALLS"
[ -n "${GPU_CHECK_FLOW_SLEEP:-}" ] && [[ "$*" == *"$GPU_CHECK_FLOW_SLEEP"* ]] && sleep 60
[ -n "${GPU_CHECK_FLOW_STOP:-}" ] && [[ "$*" == *"$GPU_CHECK_FLOW_STOP"* ]] && kill -TERM "$GPU_CHECK_FLOW_SCRIPT"
json=""; model=""; policy=""; shape=""
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json="$2"; shift;; --model) model="$2"; shift;; --policy) policy="$2"; shift;;
    --batch-size|--context|--width|--layers|--heads) f="${1#--}"; shape="$shape, \"${f/-/_}\": $2"; shift;;
  esac
  shift
done
# bench step's defaults, as the real one writes them
case "$model" in
  transformer) [[ "$shape" == *batch_size* ]] || shape="$shape, \"batch_size\": 32"
               [[ "$shape" == *context* ]] || shape="$shape, \"context\": 64, \"width\": 128, \"layers\": 2, \"heads\": 4"
               shape="$shape, \"vocabulary\": 83";;
  mlp|cnn) [[ "$shape" == *batch_size* ]] || shape="$shape, \"batch_size\": 256";;
esac
case "$model/$policy" in cnn/mixed_float16) echo "stand-in failure" >&2; exit 1;; esac
case "$json" in
  *bench-gemm-gpu.json) echo "{\"gemm\": [{\"n\": 8192, \"dtype\": \"bfloat16\", \"gflops\": 700000.0,
                                 \"gemm_fallback_products\": ${GPU_CHECK_FLOW_FALLBACK:-0}}]}" > "$json";;
  *step-*) ms=$([ "$policy" = float32 ] && echo 6.0 || echo 2.0)
           echo "{\"ms_per_step\": $ms, \"step_peak_memory_bytes\": 1000$shape}" > "$json";;
  *doctor.json) echo '{"gpus": {"devices": [{"name": "stand-in", "gemm": {}}]}, "verdicts": []}' > "$json";;
  *train-*) echo '{"test": {"loss": 0.3, "accuracy": 0.9}, "step_loss": [1.0, 0.5], "peak_memory_bytes": 1}' > "$json";;
esac
echo "done"
T
cat > "$b/tools/gpu_bench/mixtrain_gpu_bench" <<'T'
#!/usr/bin/env bash
echo "mixtrain_gpu_bench $*" >> "$GPU_CHECK_FLOW_CALLS"
echo '{"what": "mixtrain_unscale_check", "dtype": "float16", "n": 1024, "bit_identical": true}'
echo '{"what": "mixtrain_unscale_step", "dtype": "float16", "n": 1048576, "us_per_step": 20.0}'
T
chmod +x "$b"/tests/*/* "$b/tools/cli/mixtrain" "$b/tools/gpu_bench/mixtrain_gpu_bench"
SH
chmod +x "$tmp/bin/cmake" "$tmp/bin/ninja" "$tmp/bin/nvidia-smi" "$tmp/bin/nvcc"
# GoogleTest's source, zlib's and nlohmann JSON's headers, as the script looks for them (carried by gpu-carry.sh), so
# every step runs.
mkdir -p "$tmp/repo/.gpu/googletest" "$tmp/repo/.gpu/prefix/include/nlohmann"
touch "$tmp/repo/.gpu/googletest/CMakeLists.txt" "$tmp/repo/.gpu/prefix/include/zlib.h" \
  "$tmp/repo/.gpu/prefix/include/nlohmann/json.hpp"

export PATH="$tmp/bin:$PATH" GPU_CHECK_FLOW_CALLS="$tmp/calls.log"
set +e
(cd "$tmp/repo" && GPU_CHECK_FLOW_FALLBACK=4 bash scripts/gpu-check.sh --out "$tmp/out") > "$tmp/run.log" 2>&1
status=$?
set -e
fail() { echo "FAIL: $*"; cat "$tmp/run.log"; exit 1; }
[ "$status" -eq 1 ] || fail "exit status $status, expected 1 (one PyTorch case and one bench step fail)"
for f in gpu-check.log gpu-check.json gpu-check-files.tar.gz; do [ -s "$tmp/out/$f" ] || fail "OUT lacks $f"; done
grep -q "bench step --device cuda --model cnn --policy mixed_float16 FAILED" "$tmp/out/gpu-check.log" ||
  fail "the failing bench step was not reported"
grep -q "PyTorch GEMMs and training steps FAILED" "$tmp/out/gpu-check.log" || fail "the PyTorch failure was not reported"
# bench gemm's stand-in ran 4 products on the fallback kernel: said, after the figures, as a failure.
grep -q "GEMM FALLBACK: 4 products at the benchmark shapes ran on the fallback kernel" "$tmp/out/gpu-check.log" ||
  fail "the fallback products were not reported"
# Every step ran, in the order the script gives, after the failures.
python3 - "$tmp/calls.log" "$tmp/out" <<'PY'
import json, os, sys, tarfile
calls = open(sys.argv[1]).read().splitlines()
first = lambda word: next(i for i, c in enumerate(calls) if word in c)
order = ["cmake -S .gpu/googletest", "cmake --build build-gpu/googletest", "cmake --install build-gpu/googletest",
         "cmake -S . -B build-gpu", "ops_test", "bench gemm", "bench step", "peer_torch matmul", "--context 512", "gpu_training_test", "nccl_api_test", "precision_test", "mixtrain doctor",
         "train --device cpu", "train --device cuda", "mixtrain_gpu_bench"]
at = [first(w) for w in order]
# GoogleTest is built from its carried source with this machine's compiler, and the build finds it first.
configure = calls[first("cmake -S . -B build-gpu")]
assert "-DMIXTRAIN_TESTS=ON" in configure, configure
assert configure.split("-DCMAKE_PREFIX_PATH=")[1].split(";")[0].endswith("build-gpu/googletest-prefix"), configure
assert at == sorted(at), f"steps out of order: {list(zip(order, at))}"
# Every model under every policy at bench step's shapes, then the MLP and transformer at those sized for a GPU.
assert sum("bench step" in c for c in calls) == 15, "every model under every policy, and the larger shapes"
assert sum("bench step --device cuda --model transformer --context 512" in c for c in calls) == 3, calls
# The shapes sized for a GPU, as each side was given them: mixtrain's flags and PyTorch's arguments agree.
large_mlp = [c for c in calls if c.startswith("mixtrain bench step") and "--model mlp --batch-size 4096" in c]
assert len(large_mlp) == 3, calls
large_t = [c for c in calls if c.startswith("mixtrain bench step") and "--model transformer --context" in c]
assert len(large_t) == 3 and all("--context 512 --width 768 --layers 4 --heads 12 --batch-size 16" in c
                                 for c in large_t), large_t
torch_large = [c for c in calls if c.startswith("peer_torch") and ("batch 4096" in c or "context 512" in c)]
assert sorted(torch_large) == sorted(
    [f"peer_torch mlp {v} batch 4096" for v in ("float32", "autocast_float16", "autocast_bfloat16")] +
    [f"peer_torch transformer {v} vocabulary 83 context 512 width 768 layers 4 heads 12 batch 16"
     for v in ("float32", "autocast_float16", "autocast_bfloat16")]), torch_large
s = json.load(open(os.path.join(sys.argv[2], "gpu-check.json")))
steps = {(r["model"], r["policy"]): r for r in s["train_steps"]}
assert len(steps) == 14 and ("cnn", "mixed_float16") not in steps, sorted(steps)
assert abs(steps[("transformer_large", "mixed_float16")]["speedup_vs_float32"] - 3.0) < 1e-9
# Each step beside PyTorch's record of its own shape (the stand-in's ms per step is its batch / 8).
for case, torch_ms in (("mlp", 32.0), ("mlp_large", 512.0), ("cnn", 32.0), ("transformer", 4.0),
                       ("transformer_large", 2.0)):
    assert steps[(case, "mixed_bfloat16")]["torch_ms"] == torch_ms, (case, steps[(case, "mixed_bfloat16")])
assert steps[("cnn", "float32")]["torch_ms"] == 32.0 and ("cnn", "mixed_float16") not in steps
assert abs(steps[("mlp", "mixed_bfloat16")]["speedup_vs_float32"] - 3.0) < 1e-9
assert s["gemm"][0]["gflops"] == 700000.0 and s["train_cli"]["accuracy_gap"] == 0.0
assert s["machine"].get("cpus") and s["machine"].get("date"), s["machine"]  # the machine, for the figures' record
names = tarfile.open(os.path.join(sys.argv[2], "gpu-check-files.tar.gz")).getnames()
for f in ("./machine.txt", "./gpu-tests.json", "./bench-gemm-gpu.json", "./step-transformer-mixed_bfloat16.json", "./mixtrain.jsonl",
          "./train-cuda.json", "./gpu-check.json"):
    assert f in names, f"{f} not archived: {names}"
assert "./teacher.csv" not in names
print("gpu-check flow: every step ran in order, failures reported, summary and archive written")
PY

# Cut short where doctor starts (the script is stopped, as a device call's limit stops it): the benchmarks' figures
# were taken before, and OUT already holds them.
rm -rf "$tmp/out" "$tmp/calls.log"
set +e
(cd "$tmp/repo" && exec env GPU_CHECK_FLOW_STOP="doctor --seconds" bash -c \
  'export GPU_CHECK_FLOW_SCRIPT=$$; exec bash scripts/gpu-check.sh --out "$0"' "$tmp/out") > "$tmp/run2.log" 2>&1
set -e
[ -s "$tmp/out/gpu-check.json" ] || { cat "$tmp/run2.log"; echo "FAIL: a run stopped at doctor left no summary"; exit 1; }
python3 - "$tmp/out/gpu-check.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert len(s["train_steps"]) == 14 and s["gemm"], "the benchmarks' figures are missing from a run stopped later"
print("gpu-check cut short: the figures taken before the stop are in OUT")
PY

# Less time than the first step takes: GPU_CHECK_BUDGET=30 leaves 15 s for the steps, too little to build the tests
# and keep 240 s for the figures (the tests are skipped), and bench gemm's stand-in sleeps 60 s.
rm -rf "$tmp/out" "$tmp/calls.log"
set +e
start=$SECONDS
(cd "$tmp/repo" && GPU_CHECK_BUDGET=30 GPU_CHECK_FLOW_SLEEP="bench gemm" bash scripts/gpu-check.sh --out "$tmp/out") \
  > "$tmp/run3.log" 2>&1
status=$?
took=$((SECONDS - start))
set -e
log3="$tmp/out/gpu-check.log"
fail3() { cat "$log3"; echo "FAIL: $*"; exit 1; }
[ "$status" -eq 1 ] || fail3 "a run out of time exited $status, expected 1"
[ "$took" -le 30 ] || fail3 "a run with GPU_CHECK_BUDGET=30 took ${took}s"
grep -q "no time left to build the tests before the figures" "$log3" || fail3 "the skipped tests were not reported"
if grep -q "ops_test" "$tmp/calls.log"; then fail3 "a test ran that was not built"; fi
grep -q "timed out after .*bench gemm" "$log3" || fail3 "the cut step was not reported"
grep -q "no time left in GPU_CHECK_BUDGET, skipped: .*mixtrain bench step" "$log3" ||
  fail3 "the steps after the budget were not reported as skipped"
if grep -q "bench step" "$tmp/calls.log"; then fail3 "a step ran after the budget was spent"; fi
[ -s "$tmp/out/gpu-check.json" ] || fail3 "OUT lacks the summary"
echo "gpu-check out of time: the tests skipped, the step cut at the budget, the rest skipped, done in ${took}s"
# A build that fails: PyTorch's figures need nothing of it and are still taken.
rm -rf "$tmp/out" "$tmp/calls.log"
set +e
(cd "$tmp/repo" && GPU_CHECK_FLOW_BUILD_FAILS=1 bash scripts/gpu-check.sh --out "$tmp/out") > "$tmp/run4.log" 2>&1
status=$?
set -e
log4="$tmp/out/gpu-check.log"
[ "$status" -eq 1 ] || { cat "$log4"; echo "FAIL: a failed build exited $status, expected 1"; exit 1; }
grep -q "build failed" "$log4" || { cat "$log4"; echo "FAIL: the failed build was not reported"; exit 1; }
grep -q "peer_torch transformer autocast_bfloat16 vocabulary 83 context 512" "$tmp/calls.log" ||
  { cat "$log4"; echo "FAIL: PyTorch's step did not run after a failed build"; exit 1; }
[ -s "$tmp/out/gpu-check.json" ] || { cat "$log4"; echo "FAIL: a failed build left no summary"; exit 1; }
echo "gpu-check with a failed build: PyTorch's step still ran"
# A driver older than the toolkit (CUDA 12.4 against nvcc's 13.0): one line before anything is built, exit 2, and
# the log in OUT. One of the same major version (13.0 here is the toolkit's) goes on.
rm -rf "$tmp/out" "$tmp/calls.log"
set +e
(cd "$tmp/repo" && GPU_CHECK_FLOW_DRIVER=12.4 bash scripts/gpu-check.sh --out "$tmp/out") > "$tmp/run5.log" 2>&1
status=$?
set -e
log5="$tmp/out/gpu-check.log"
fail5() { cat "$tmp/run5.log"; echo "FAIL: $*"; exit 1; }
[ "$status" -eq 2 ] || fail5 "an older driver exited $status, expected 2"
[ "$(grep -c "pre-flight FAILED" "$log5")" -eq 1 ] || fail5 "the old driver was not said in one line"
grep -q "pre-flight FAILED: the driver supports CUDA 12.4, older than the toolkit's CUDA 13.0" "$log5" ||
  fail5 "the line does not name both versions"
# (cmake --version is the machine's record, taken before.)
if grep -v -x "cmake --version" "$tmp/calls.log"; then fail5 "something ran after the pre-flight stopped"; fi
grep -q "pre-flight: the driver supports CUDA 13.0, the toolkit is CUDA 13.0" "$tmp/run.log" ||
  { cat "$tmp/run.log"; echo "FAIL: a matching driver was not reported"; exit 1; }
echo "gpu-check with an older driver: stopped at the pre-flight with one line"
echo "gpu-check flow ok"
