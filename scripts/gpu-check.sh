#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU where the CUDA toolkit, CMake, ninja and PyTorch with CUDA are
# present and nothing else can be installed. Builds the CUDA backend with every core (build-gpu), runs the kernels'
# tests with a GPU required (a skip is a failure), then takes the targets' figures: `mixtrain bench gemm --device
# cuda` (float32, float16 and bfloat16 GEMMs through the backend's cuBLASLt matmul), `mixtrain bench step --device
# cuda` for the MLP, CNN and transformer under each policy (at bench step's shapes, then the MLP and transformer at
# larger ones sized for a GPU), and PyTorch on the same GPU in one process
# (bench/peer_torch.py --device cuda: torch.mm at bench gemm's sizes, TF32 off as mixtrain's default, and the same
# models' steps under autocast, GradScaler for float16, with peak memory). Then the longer tests (every registered
# model trained on the GPU against the CPU, NCCL on one rank, doctor with every GPU measured), `mixtrain doctor`,
# `mixtrain train --device cuda` against `--device cpu` on a small CSV, and the loss-scaling step of mixtrain and of
# PyTorch AMP (torch._amp_foreach_non_finite_check_and_unscale_ and torch._amp_update_scale_, what GradScaler runs;
# PyTorch has no bfloat16 kernel for it) on the same sizes. scripts/gpu_check_summary.py reads it all back into
# gpu-check.json, after every step too, so a run cut short still returns the figures taken. A GEMM product that ran on
# the backend's fallback kernel at the benchmark shapes fails the check (the summary's gemm_fallback names it). Well under 8 minutes;
# GPU_CHECK_BUDGET (seconds, default 560: a device call's limit is 590) caps the whole run, the configure and build
# included: each step's cap is cut to what is left, and the steps that no longer fit are skipped and reported.
# (PyTorch unscales 16-bit gradients in place, in 16 bits; mixtrain unscales them into float32, where small ones
# cannot underflow: it moves 4 more bytes per element.)
#
#   bash scripts/gpu-check.sh [--out DIR] [--dry-run]     (default DIR: ./gpu-check-out, or $OUT when set)
# DIR receives three files: gpu-check.log (as the run goes), gpu-check.json (the summary) and gpu-check-files.tar.gz
# (every step's own output: the tests' JSON, each bench's JSON, PyTorch's records).
# --dry-run prints each step, its time cap and its command, and runs none of them (no GPU needed, nothing written
# under DIR): what a run would do with this budget, checked here before the GPU's minutes are spent.
#
# Before anything is built, a pre-flight compares the CUDA version the driver supports (nvidia-smi, else
# cuDriverGetVersion through libcuda.so.1) with the toolkit's (nvcc --version): a driver of an older major version
# stops the run with one line (nothing built would run: every CUDA call fails with an insufficient driver), one of an
# older minor version is reported and the run goes on (CUDA's minor version compatibility: the build's machine code
# for this GPU runs on any driver of the same major version).
#
# An image without GoogleTest, nlohmann JSON or zlib's headers (the H200 machines' has CUDA and PyTorch only): run
# `bash scripts/gpu-carry.sh` on a Debian machine first and send its .gpu folder along (the run tool's carry: .gpu);
# it is used when present. GoogleTest travels as source (.gpu/googletest) and is built here first with this
# machine's compiler, into build-gpu/googletest-prefix: a static library built elsewhere fails to link where the C++
# runtime is older. Without a carried copy, /usr/src/googletest (Debian's and Ubuntu's googletest package) is built
# the same way; without either, an installed GoogleTest is used.
#
# What the GPU backend covers is listed in docs/ARCHITECTURE.md; the tests below (the CudaBackend, CudaSharedMath,
# CudaGemmFallback, CudaFlashAttention, CudaLinearCrossEntropy, Cast, GemmTiming and SideStream suites, and the Doctor suite with every GPU measured) check every CUDA
# kernel against the CPU's, layer normalization, the embedding, the CNN ops (pooling, batch normalization, conv2d:
# tests/ops/cuda_cnn_test.cpp), the losses, sum/mean, the accuracy and the counted unscale
# (tests/ops/cuda_losses_test.cpp), attention and the backward passes given a gradient of another dtype
# (tests/ops/cuda_attention_test.cpp), the fused optimizer update (SGD, RMSprop, Adam, AdamW) of a GPU parameter
# arena (bit for bit against the CPU optimizer), the timed GEMM of `bench gemm --device` and doctor
# (tests/ops/cuda_gemm_timing_test.cpp), the GEMM kernel for the products cuBLASLt declines
# (tests/ops/cuda_gemm_fallback_test.cpp, the CudaGemmFallback suite), the tiled attention (the CudaFlashAttention
# suite, tests/ops/cuda_flash_attention_test.cpp: bit for bit against its host driver, and against the CPU kernel),
# the chunked linear + cross-entropy (the CudaLinearCrossEntropy suite) and
# the FP8 pieces (float8 casts, fp8_amax, fp8_quantize, mx_block_quantize, mx_block_encode and mx_block_decode,
# scaled_matmul on cuBLASLt's FP8 GEMM: tests/ops/cuda_fp8_test.cpp) included;
# then every registered model trains on the GPU against the CPU (tests/train/gpu_training_test.cpp), mixed_float8
# too (its products on FP8 tensor cores; skipped below compute capability 8.9).
# Without GoogleTest (the tests' framework) the tests are left out and mixtrain_gpu_bench's own check against the
# CPU bits decides.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2;;
    --dry-run) dry_run=1; shift;;
    *) echo "gpu-check: unknown argument '$1' (expected --out DIR or --dry-run)" >&2; exit 2;;
  esac
done
# A dry run's lines go to the caller's stdout (fd 3), also from steps whose output is redirected to a file.
exec 3>&1
if [ "$dry_run" = 1 ]; then
  log=/dev/null
else
  mkdir -p "$out"
  log="$out/gpu-check.log"
  : > "$log"
fi
# The steps' files go to a work folder outside OUT; OUT gets the log as the run goes, then the summary and one
# archive of the rest: a device machine returns at most 8 files of OUT, and a call cut short by its limit then
# still returns the log.
work=$(mktemp -d -t gpu-check.XXXXXX)
# Python's and the bench's lines reach their files as they are printed, so a step cut short by its cap keeps them.
export PYTHONUNBUFFERED=1
line_buffered=()
if command -v stdbuf > /dev/null 2>&1; then line_buffered=(stdbuf -oL); fi
say() { echo "gpu-check: $*" | tee -a "$log"; }
if [ "$dry_run" = 1 ]; then say() { echo "gpu-check: $*" >&3; }; fi
# A step as a dry run shows it: its cap in seconds and its command, quoted as a shell would read it.
show() {
  local seconds=$1
  shift
  echo "gpu-check: [dry run] step, cap ${seconds}s: ${MIXTRAIN_REQUIRE_GPU:+MIXTRAIN_REQUIRE_GPU=$MIXTRAIN_REQUIRE_GPU }$(printf '%q ' "$@")" >&3
}
# The end of the whole run, with 15 s kept for the last summary and archive (and a step's 10 s kill grace).
deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-560} - 15))

# The summary and the archive so far, into OUT: a call cut short by its limit still returns the figures taken.
# Each is written beside its old copy and renamed over it, so a stop part way leaves the previous one whole.
snapshot() {
  [ "$dry_run" = 1 ] && return 0
  python3 scripts/gpu_check_summary.py "$work" > /dev/null 2>&1 || true
  if [ -e "$work/gpu-check.json" ]; then
    cp "$work/gpu-check.json" "$out/gpu-check.json.part" 2>/dev/null && mv -f "$out/gpu-check.json.part" "$out/gpu-check.json"
  fi
  tar czf "$out/gpu-check-files.tar.gz.part" --exclude=./teacher.csv -C "$work" . 2>/dev/null &&
    mv -f "$out/gpu-check-files.tar.gz.part" "$out/gpu-check-files.tar.gz" || true
}
# A stop from outside (a device call's limit): the snapshots after each finished step already hold what was taken;
# this one more runs only if the TERM reaches the script before the caller's KILL (bash runs it once the running step
# ends, and a step under timeout is in a process group of its own).
trap 'say "stopped from outside"; snapshot; exit 143' TERM
# Seconds left of the budget for a step that is not capped() (the configure and the build), at least 1.
left() { local l=$((deadline - SECONDS)); echo $((l > 1 ? l : 1)); }
# A step of the build (GoogleTest, the configure, the compiles), capped at SECONDS but not skipped or snapshotted as
# capped() steps are: a dry run shows it.
bounded() {
  local seconds=$1
  shift
  if [ "$dry_run" = 1 ]; then
    show "$seconds" "$@"
    return 0
  fi
  timeout "$seconds" "$@"
}
# Whether the loader's cache lists a library (read whole first: grep -q stopping early would make ldconfig's pipe
# fail under pipefail and read as "not listed").
listed() { local cache; cache=$(ldconfig -p 2>/dev/null || true); [[ "$cache" == *"$1"* ]]; }

# Runs a step with a cap on its time, so one that hangs on a GPU costs its cap, not the whole call: the cap is cut to
# what is left of GPU_CHECK_BUDGET, and a step that no longer fits is skipped (status 124). The note goes to stderr
# (the log), never into a step's JSON output. The summary and archive are refreshed after every step.
capped() {
  local seconds=$1 rc=0 left=$((deadline - SECONDS))
  shift
  if [ "$left" -lt 5 ]; then
    echo "gpu-check: no time left in GPU_CHECK_BUDGET, skipped: $*" >&2
    return 124
  fi
  [ "$seconds" -gt "$left" ] && seconds=$left
  if [ "$dry_run" = 1 ]; then
    show "$seconds" "$@"
    return 0
  fi
  timeout -k 10 "$seconds" "$@" || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "gpu-check: timed out after ${seconds}s: $*" >&2; fi
  snapshot
  return "$rc"
}

status=0
# The shapes sized for a GPU, defined once for both sides: mixtrain's flags (step_case after bench step's own shapes)
# and PyTorch's arguments (torch_figures) come from these. The MLP's batch; the transformer's context, width,
# layers, heads and batch (the vocabulary is bench step's 83 characters on both sides).
large_mlp_batch=4096
large_context=512 large_width=768 large_layers=4 large_heads=12 large_batch=16
# PyTorch's side of the targets: it needs nothing of mixtrain's build, so a build that fails still takes it.
torch_figures() {
  say "PyTorch on the GPU (bench/peer_torch.py, one process): matmul at bench gemm's sizes and dtypes, then AMP's MLP,"
  say "  CNN and transformer steps at bench step's shapes and the MLP and transformer at those sized for a GPU"
  say "  (autocast; GradScaler for float16)"
  # (One line: the heredoc's text starts on the line after the command's.)
  capped 240 python3 - "$work" "$large_mlp_batch" "$large_context" "$large_width" "$large_layers" "$large_heads" "$large_batch" 2>> "$log" <<'PY' || { say "PyTorch GEMMs and training steps FAILED"; status=1; }
import json, os, sys, traceback
sys.path.insert(0, "bench")
import peer_torch as peer  # exits with status 3 when torch is not importable
out = sys.argv[1]
large_mlp_batch = int(sys.argv[2])
large_context, large_width, large_layers, large_heads, large_batch = (int(v) for v in sys.argv[3:8])
target = peer.Target("cuda")
failed = False
def run(name, what, *args):
    global failed
    # Each case's record goes to its file; one that fails is reported and the others still run.
    with open(os.path.join(out, name), "a") as f:
        sys.stdout = f
        try:
            what(*args, target)
        except Exception:
            traceback.print_exc()
            failed = True
        finally:
            sys.stdout = sys.__stdout__
for name in ("torch-gemm.jsonl", "torch-steps.jsonl"):
    with open(os.path.join(out, name), "w") as f:
        f.write(json.dumps(dict({"what": "peer_torch_info", "version": peer.torch.__version__}, **target.info())) + "\n")
run("torch-gemm.jsonl", peer.bench_matmul, [1024, 4096, 8192], 0.5)
for variant in ("float32", "autocast_float16", "autocast_bfloat16"):
    run("torch-steps.jsonl", peer.bench_step, variant, [4096, 4096], 256, 20)
    run("torch-steps.jsonl", peer.bench_cnn_step, variant, 128, 256, 20, "channels_last")
    run("torch-steps.jsonl", peer.bench_transformer_step, variant, 83, 64, 128, 2, 4, 32, 20)
# The shapes sized for a GPU (large_mlp_batch, large_context ...); the summary pairs each of mixtrain's steps with
# the record of its shape.
for variant in ("float32", "autocast_float16", "autocast_bfloat16"):
    run("torch-steps.jsonl", peer.bench_step, variant, [4096, 4096], large_mlp_batch, 20)
    run("torch-steps.jsonl", peer.bench_transformer_step, variant, 83, large_context, large_width, large_layers,
        large_heads, large_batch, 20)
sys.exit(1 if failed else 0)
PY
}

# The machine, for the figures' record (docs/PERFORMANCE.md names the GPU, the driver and the toolkit beside them).
if [ "$dry_run" = 0 ]; then
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)"
    echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | tail -1 || true)"
    echo "c++: $(c++ --version 2>/dev/null | head -1 || true)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1 || true)"
    echo "os: $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-}" || true)"
    echo "cpus: $(nproc)"
  } > "$work/machine.txt" 2>/dev/null || true
  sed 's/^/gpu-check: machine: /' "$work/machine.txt" | tee -a "$log"
else
  say "machine record: date, GPU (nvidia-smi), nvcc, c++, cmake, os, cpus into machine.txt"
fi

# Pre-flight: the CUDA version the driver supports against the toolkit's. A driver of an older major version runs
# nothing this toolkit builds (every CUDA call fails with an insufficient driver): say so in one line before minutes
# of compiling. An older minor version is fine (CUDA's minor version compatibility) and only reported.
toolkit_cuda() {
  { nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null || true; } |
    sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1
}
driver_cuda() {
  local v
  v=$({ nvidia-smi 2>/dev/null || true; } | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1)
  if [ -z "$v" ]; then
    v=$(python3 -c 'import ctypes
v = ctypes.c_int(0)
ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
print(f"{v.value // 1000}.{v.value % 1000 // 10}" if v.value else "")' 2>/dev/null || true)
  fi
  echo "$v"
}
preflight() {
  local driver toolkit
  driver=$(driver_cuda)
  toolkit=$(toolkit_cuda)
  if [ -z "$driver" ] || [ -z "$toolkit" ]; then
    say "pre-flight: driver CUDA ${driver:-unknown (no nvidia-smi, no libcuda.so.1)}, toolkit CUDA ${toolkit:-unknown (no nvcc)}: not compared, going on"
    return 0
  fi
  if [ "${driver%%.*}" -lt "${toolkit%%.*}" ]; then
    say "pre-flight FAILED: the driver supports CUDA $driver, older than the toolkit's CUDA $toolkit (nvcc): nothing built here would run; use a machine whose driver supports CUDA ${toolkit%%.*}.x, or a CUDA ${driver%%.*} toolkit"
    return 1
  fi
  if [ "${driver%%.*}" -eq "${toolkit%%.*}" ] && [ "${driver#*.}" -lt "${toolkit#*.}" ]; then
    say "pre-flight: the driver supports CUDA $driver, the toolkit is CUDA $toolkit: same major version, so it runs (minor version compatibility)"
  else
    say "pre-flight: the driver supports CUDA $driver, the toolkit is CUDA $toolkit"
  fi
}
if [ "$dry_run" = 1 ]; then
  say "pre-flight: the driver's CUDA version (nvidia-smi, else cuDriverGetVersion) against the toolkit's (nvcc --version); an older major version stops the run here"
elif ! preflight; then
  snapshot
  exit 2
fi

# The libraries scripts/gpu-carry.sh gathered on a Debian machine (nlohmann JSON, zlib), for an image that lacks
# them: searched before the system's.
prefixes=""
if [ -d .gpu/prefix ]; then
  prefixes="$PWD/.gpu/prefix"
  say "using the libraries carried in .gpu/prefix (scripts/gpu-carry.sh)"
fi
# zlib and nlohmann JSON are needed by every build (the CLI reads and writes JSON and compressed files): without
# them, say so now rather than after the configure.
has_header() { [ -e "/usr/include/$1" ] || [ -e "/usr/local/include/$1" ] || [ -e ".gpu/prefix/include/$1" ]; }
for h in zlib.h nlohmann/json.hpp; do
  if ! has_header "$h"; then
    say "$h not found: run bash scripts/gpu-carry.sh on a Debian machine and send its .gpu folder along (carry .gpu)"
    [ "$dry_run" = 1 ] || exit 2
  fi
done
# GoogleTest, built here from source with this machine's compiler (see the top): the carried copy, else Debian's
# /usr/src/googletest; else an installed one.
tests=ON
gtest_src=""
gtest_prefix="$PWD/build-gpu/googletest-prefix"
if [ -e .gpu/googletest/CMakeLists.txt ]; then
  gtest_src=.gpu/googletest
elif [ -e /usr/src/googletest/CMakeLists.txt ]; then
  gtest_src=/usr/src/googletest
elif ! { [ -e /usr/include/gtest/gtest.h ] || [ -e /usr/local/include/gtest/gtest.h ]; }; then
  tests=OFF
  say "GoogleTest not found (bash scripts/gpu-carry.sh on a Debian machine carries its source): building without the tests"
  say "  (mixtrain_gpu_bench checks the kernels against the CPU)"
fi
# The tests' build keeps 240 s of the budget for the figures' steps, GoogleTest's about 60 s more: with less left,
# neither is built.
if [ "$tests" = ON ] && [ $(( $(left) - 240 )) -lt 80 ]; then
  say "no time left to build the tests before the figures: they are skipped (GoogleTest is not built)"
  tests=OFF
  status=1
fi
if [ "$tests" = ON ] && [ -n "$gtest_src" ]; then
  say "GoogleTest from source ($gtest_src) into $gtest_prefix"
  if bounded 60 cmake -S "$gtest_src" -B build-gpu/googletest -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_INSTALL_PREFIX="$gtest_prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_GMOCK=OFF \
       -DINSTALL_GTEST=ON >> "$log" 2>&1 &&
     bounded 120 cmake --build build-gpu/googletest -j "$(nproc)" >> "$log" 2>&1 &&
     bounded 30 cmake --install build-gpu/googletest >> "$log" 2>&1; then
    prefixes="$gtest_prefix${prefixes:+;$prefixes}"
  else
    say "GoogleTest did not build (see $log): building without the tests"
    tests=OFF
    status=1
  fi
fi
carried=()
if [ -n "$prefixes" ]; then carried=(-DCMAKE_PREFIX_PATH="$prefixes"); fi
if [ -d .gpu/prefix ]; then carried+=(-DZLIB_ROOT="$PWD/.gpu/prefix"); fi
# Machine code for this machine's GPU only (its compute capability from nvidia-smi, e.g. 9.0 -> 90): a third of the
# default's compile (75, 80 and 90). Where nvidia-smi cannot say, the default architectures.
arch=()
cc=""
[ "$dry_run" = 1 ] || cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
if [[ "$cc" =~ ^[0-9]+$ ]]; then arch=(-DCMAKE_CUDA_ARCHITECTURES="$cc"); fi
say "configuring build-gpu (MIXTRAIN_CUDA=ON, tests $tests, CUDA architectures ${cc:-75 80 90})"
bounded "$(( $(left) < 120 ? $(left) : 120 ))" cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIXTRAIN_CUDA=ON -DMIXTRAIN_TESTS="$tests" \
  -DMIXTRAIN_BENCH=OFF -DMIXTRAIN_MPI=OFF "${carried[@]}" "${arch[@]}" >> "$log" 2>&1 ||
  { say "configure failed (see $log)"; tail -20 "$log"; torch_figures; snapshot; exit 1; }
# The CLI and the bench first: they take the figures. The tests after, every one that compiles (-k 0): a compiler
# that rejects one test leaves the figures and the other tests, and that test's step fails as a missing binary (the
# test binaries of an earlier build are removed first, so none of them runs for a test that no longer compiles).
# The tests' build keeps 240 s of the budget for the figures' steps: a slow compiler costs tests, not figures.
bounded "$(left)" ninja -C build-gpu -j "$(nproc)" mixtrain_gpu_bench mixtrain_cli >> "$log" 2>&1 ||
  { say "build failed (see $log)"; tail -30 "$log"; torch_figures; snapshot; exit 1; }
test_binaries=(build-gpu/tests/ops/ops_test build-gpu/tests/precision/precision_test build-gpu/tests/train/gpu_training_test
               build-gpu/tests/distributed/nccl_api_test)
if [ "$dry_run" = 0 ]; then rm -f "${test_binaries[@]}"; fi
test_build=$(( $(left) - 240 < 300 ? $(left) - 240 : 300 ))
if [ "$tests" = ON ] && [ "$test_build" -lt 20 ]; then
  say "no time left to build the tests before the figures: they are skipped"
  tests=OFF
  status=1
fi
if [ "$tests" = ON ] && ! bounded "$test_build" ninja -C build-gpu -j "$(nproc)" -k 0 ops_test precision_test gpu_training_test \
       nccl_api_test >> "$log" 2>&1; then
  say "some tests did not build (see $log); the rest run"
  status=1
fi
say "built in ${SECONDS}s"

# cuBLASLt: the loader's or the toolkit's libcublasLt.so.13, else the one PyTorch's packages carry (nvidia-cu13 or
# nvidia-cublas), put on the loader's path for the binaries below.
cuda_lib="$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64"
if ! listed libcublasLt.so.13 && [ ! -e "$cuda_lib/libcublasLt.so.13" ]; then
  lt=$(python3 -c 'import glob, os, nvidia
print(next(iter(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib", "libcublasLt.so.13")))), ""))' \
       2>/dev/null || true)
  if [ -n "$lt" ]; then
    export LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "cuBLASLt from PyTorch's packages: $lt"
  fi
fi
# The order puts the targets' figures first: the kernels' own tests, then the GEMM and training-step benchmarks of
# mixtrain and PyTorch, then the longer training tests, doctor, the CLI and the loss-scaling step.
if [ "$tests" = ON ]; then
  say "GPU tests (MIXTRAIN_REQUIRE_GPU=1)"
  # At most 180 s, and no more than leaves the figures' 240 s (but 30 s at least: the kernels' own verdict).
  gpu_tests=$(( $(left) - 240 ))
  gpu_tests=$(( gpu_tests > 180 ? 180 : (gpu_tests < 30 ? 30 : gpu_tests) ))
  if ! MIXTRAIN_REQUIRE_GPU=1 capped "$gpu_tests" build-gpu/tests/ops/ops_test \
         --gtest_filter='CudaBackend.*:CudaSharedMath.*:CudaGemmFallback.*:CudaFlashAttention.*:CudaLinearCrossEntropy.*:Cast.*:Backend.*:BackendCoverage.*:GemmTiming.*:SideStream.*' \
         --gtest_output="json:$work/gpu-tests.json" >> "$log" 2>&1; then
    say "GPU tests FAILED"
    status=1
  fi
fi

say "mixtrain bench gemm --device cuda: float32, float16, bfloat16 GEMMs through the backend's cuBLASLt matmul"
if ! capped 90 build-gpu/tools/cli/mixtrain bench gemm --device cuda --sizes 1024,4096,8192 --seconds 0.5 \
       --json "$work/bench-gemm-gpu.json" 2>> "$log" | tee -a "$log"; then
  say "bench gemm --device cuda FAILED"
  status=1
fi
# One case of mixtrain's training step under each policy: step_case NAME FLAGS... (FLAGS: the model and its shape),
# into step-NAME-POLICY.json.
step_case() {
  local name=$1 policy
  shift
  for policy in float32 mixed_float16 mixed_bfloat16; do
    if ! capped 60 build-gpu/tools/cli/mixtrain bench step --device cuda "$@" --policy "$policy" --steps 20 \
           --json "$work/step-$name-$policy.json" 2>> "$log" | tee -a "$log"; then
      say "bench step --device cuda $* --policy $policy FAILED"
      status=1
    fi
  done
}
say "mixtrain bench step --device cuda: MLP, CNN and transformer training steps under each policy"
for model in mlp cnn transformer; do step_case "$model" --model "$model"; done
# PyTorch's figures before mixtrain's larger shapes: a slow large case cannot take the time of the comparisons at
# bench step's shapes.
torch_figures

# The same models at shapes sized for a GPU (large_mlp_batch, large_context ...), where a step's time is in its
# arithmetic rather than in launching kernels: bench step's defaults (above: the CPU's figures, the main job's
# transformer) give an H200 so little work per kernel that 16-bit arithmetic may show little of its speed. The MLP
# at a batch of 4096; the transformer of width 768 (4 layers of 12 heads) over 16 windows of 512 characters a step
# (8,192 tokens). PyTorch ran the same in torch_figures.
say "mixtrain bench step --device cuda at the shapes sized for a GPU: MLP batch $large_mlp_batch; transformer" \
  "T $large_context, D $large_width, L $large_layers, heads $large_heads, batch $large_batch"
step_case mlp_large --model mlp --batch-size "$large_mlp_batch"
step_case transformer_large --model transformer --context "$large_context" --width "$large_width" \
  --layers "$large_layers" --heads "$large_heads" --batch-size "$large_batch"

snapshot
# A product the backend's fallback kernel ran at these shapes (bench gemm's and bench step's counts, summed in the
# summary) fails the check: the figures would time that kernel, not cuBLASLt's.
if [ "$dry_run" = 1 ]; then
  say "check: no GEMM product on the fallback kernel at the benchmark shapes (gpu-check.json's gemm_fallback)"
else
  fallback=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1])).get("gemm_fallback", {}).get("products", 0))' "$work/gpu-check.json" 2>/dev/null || echo 0)
  if [ "${fallback:-0}" != 0 ]; then
    say "GEMM FALLBACK: $fallback products at the benchmark shapes ran on the fallback kernel, not cuBLASLt (gpu-check.json's gemm_fallback names them)"
    status=1
  fi
fi

if [ "$tests" = ON ]; then
  say "training on the GPU against the CPU: every registered model under each policy (MIXTRAIN_REQUIRE_GPU=1)"
  if ! MIXTRAIN_REQUIRE_GPU=1 capped 240 build-gpu/tests/train/gpu_training_test \
         --gtest_output="json:$work/gpu-training-tests.json" >> "$log" 2>&1; then
    say "GPU training tests FAILED"
    status=1
  fi
  # NCCL: the loader's or the toolkit's libnccl.so.2, else the one PyTorch's packages carry (nvidia-nccl).
  if [ -z "${MIXTRAIN_NCCL_LIBRARY:-}" ] && ! listed libnccl.so.2 &&
     [ ! -e "$cuda_lib/libnccl.so.2" ]; then
    nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' \
           2>/dev/null || true)
    if [ -n "$nccl" ] && [ -e "$nccl" ]; then export MIXTRAIN_NCCL_LIBRARY="$nccl"; fi
  fi
  say "NCCL's device collectives on one rank (MIXTRAIN_REQUIRE_GPU=1; NCCL ${MIXTRAIN_NCCL_LIBRARY:-from the loader or toolkit})"
  if ! MIXTRAIN_REQUIRE_GPU=1 capped 60 build-gpu/tests/distributed/nccl_api_test \
         --gtest_output="json:$work/nccl-tests.json" >> "$log" 2>&1; then
    say "NCCL tests FAILED"
    status=1
  fi
  say "doctor tests (MIXTRAIN_REQUIRE_GPU=1: every GPU measured)"
  if ! MIXTRAIN_REQUIRE_GPU=1 capped 120 build-gpu/tests/precision/precision_test --gtest_filter='Doctor.*' \
         --gtest_output="json:$work/doctor-tests.json" >> "$log" 2>&1; then
    say "doctor tests FAILED"
    status=1
  fi
fi

snapshot

say "mixtrain doctor: the CPU and each GPU measured, with verdicts"
if ! capped 90 build-gpu/tools/cli/mixtrain doctor --seconds 0.5 --json "$work/doctor.json" 2>> "$log" | tee -a "$log"; then
  say "doctor FAILED"
  status=1
fi

say "mixtrain train --device cuda against --device cpu: the CLI end to end on a small CSV"
[ "$dry_run" = 1 ] && say "a teacher's CSV of 6000 rows into $work/teacher.csv (python3, for the two runs below)"
[ "$dry_run" = 1 ] || python3 - "$work/teacher.csv" <<'PY'
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
  if ! capped 120 build-gpu/tools/cli/mixtrain train --device "$device" --data "$work/teacher.csv" --hidden 64 --epochs 3 \
         --policy mixed_float16 --seed 1 --json "$work/train-$device.json" >> "$log" 2>&1; then
    say "train --device $device FAILED"
    status=1
  fi
done

say "mixtrain: check against the CPU, then time the loss-scaling step"
if ! capped 120 "${line_buffered[@]}" build-gpu/tools/gpu_bench/mixtrain_gpu_bench 200 > "$work/mixtrain.jsonl" 2>> "$log"; then
  say "mixtrain_gpu_bench FAILED"
  status=1
fi

say "PyTorch AMP: the same loss-scaling step"
capped 120 python3 - > "$work/torch.jsonl" 2>> "$log" <<'PY' || { say "PyTorch step FAILED"; status=1; }
import json, time, torch
assert torch.cuda.is_available(), "PyTorch sees no GPU"
print(json.dumps({"what": "torch", "version": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))
for dtype, name in ((torch.float32, "float32"), (torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
    # PyTorch's CUDA unscale kernel serves float32, float64 and float16 (pytorch/pytorch#127176: not bfloat16, which
    # needs no loss scaling): an unsupported dtype is recorded as such, and the others still run.
    try:
        probe = torch.ones(4, dtype=dtype, device="cuda")
        torch._amp_foreach_non_finite_check_and_unscale_([probe], torch.zeros(1, device="cuda"),
                                                         torch.ones(1, device="cuda"))
        torch.cuda.synchronize()
    except RuntimeError as e:
        print(json.dumps({"what": "torch_unscale_unsupported", "dtype": name, "reason": str(e).splitlines()[0]}))
        continue
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

rm -f "$work/teacher.csv"  # made again by any run
if [ "$dry_run" = 1 ]; then
  say "summary: python3 scripts/gpu_check_summary.py into $out/gpu-check.json, every step's files into $out/gpu-check-files.tar.gz"
  rm -rf "$work"
  say "dry run: nothing was run"
  exit 0
fi
if ! python3 scripts/gpu_check_summary.py "$work" | tee -a "$log"; then
  say "summary FAILED (every step's files are still in the archive)"
  status=1
fi
snapshot && rm -rf "$work" || true
say "summary in $out/gpu-check.json, every step's files in $out/gpu-check-files.tar.gz (exit $status)"
exit "$status"
