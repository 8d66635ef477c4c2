#!/usr/bin/env bash
# scripts/gpu-check.sh --dry-run on a machine without a GPU: it lists every step with its cap and command and runs
# none of them. Checked: the pre-flight (the driver's CUDA against the toolkit's) comes first, GoogleTest is built
# from its carried source before the configure, which finds it first; the figures' steps follow; every step line has a
# cap within GPU_CHECK_BUDGET; no stand-in binary was called and nothing was written (no OUT, no build folder). With a
# budget too small for the tests, GoogleTest and the tests are left out of the plan.
# Usage: gpu_check_dry_run_test.sh REPO_ROOT
set -eu
root="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/repo/scripts" "$tmp/bin" "$tmp/repo/.gpu/googletest" "$tmp/repo/.gpu/prefix/include/nlohmann"
cp "$root/scripts/gpu-check.sh" "$root/scripts/gpu_check_summary.py" "$tmp/repo/scripts/"
touch "$tmp/repo/.gpu/googletest/CMakeLists.txt" "$tmp/repo/.gpu/prefix/include/zlib.h" \
  "$tmp/repo/.gpu/prefix/include/nlohmann/json.hpp"
# Everything a step would run is a stand-in that records its call: a dry run calls none of them.
for b in cmake ninja nvidia-smi nvcc python3-step timeout; do
  printf '#!/usr/bin/env bash\necho "%s $*" >> "%s/calls.log"\n' "$b" "$tmp" > "$tmp/bin/$b"
  chmod +x "$tmp/bin/$b"
done
fail() { echo "FAIL: $*"; cat "$tmp/run.log"; exit 1; }

(cd "$tmp/repo" && PATH="$tmp/bin:$PATH" GPU_CHECK_BUDGET=400 bash scripts/gpu-check.sh --dry-run --out "$tmp/out") \
  > "$tmp/run.log" 2>&1 || fail "the dry run exited $?"
[ ! -e "$tmp/calls.log" ] || fail "the dry run ran: $(cat "$tmp/calls.log")"
[ ! -e "$tmp/out" ] || fail "the dry run made OUT"
[ ! -e "$tmp/repo/build-gpu" ] || fail "the dry run made build-gpu"
python3 - "$tmp/run.log" "$root" <<'PY'
import fnmatch, glob, os, re, sys
lines = open(sys.argv[1]).read().splitlines()
def first(text):
    hits = [i for i, l in enumerate(lines) if text in l]
    assert hits, f"the dry run does not list {text!r}"
    return hits[0]
order = ["pre-flight: the driver's CUDA version", "step, cap 60s: cmake -S .gpu/googletest",
         "cmake --build build-gpu/googletest", "cmake --install build-gpu/googletest", "cmake -S . -B build-gpu",
         "ninja -C build-gpu", "MIXTRAIN_REQUIRE_GPU=1 build-gpu/tests/ops/ops_test",
         "mixtrain bench gemm --device cuda", "mixtrain bench step --device cuda", "python3 - ",
         "build-gpu/tests/train/gpu_training_test", "mixtrain doctor", "build-gpu/tools/gpu_bench/mixtrain_gpu_bench",
         "summary:"]
at = [first(t) for t in order]
assert at == sorted(at), f"steps out of order: {list(zip(order, at))}"
configure = lines[first("cmake -S . -B build-gpu")]
assert "-DMIXTRAIN_TESTS=ON" in configure, configure
assert re.search(r"-DCMAKE_PREFIX_PATH=\S*build-gpu/googletest-prefix\\;\S*\.gpu/prefix", configure), configure
steps = [l for l in lines if "[dry run] step" in l]
assert len(steps) >= 30, f"only {len(steps)} steps listed"
for l in steps:
    cap = int(re.search(r"cap (\d+)s:", l).group(1))
    assert 0 < cap <= 400 - 15, f"a cap outside the budget: {l}"
assert lines[-1] == "gpu-check: dry run: nothing was run", lines[-1]
# Every test of tests/ops that needs a GPU (REQUIRE_CUDA_BACKEND or REQUIRE_CUDA_GEMM in its body) is in the GPU
# tests' filter: one left out would pass by skipping on every machine, the GPU run included.
ops_line = lines[first("MIXTRAIN_REQUIRE_GPU=1 build-gpu/tests/ops/ops_test")]
patterns = re.search(r"--gtest_filter=(\S+)", ops_line).group(1).replace("\\", "").split(":")
gpu_tests = []
for path in sorted(glob.glob(os.path.join(sys.argv[2], "tests/ops/*.cpp"))):
    parts = re.split(r"^TEST(?:_F|_P)?\((\w+), (\w+)\)", open(path).read(), flags=re.M)
    for suite, name, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        # (*Child suites are processes a test starts itself, never run on their own.)
        if "REQUIRE_CUDA_" in body.split("\n}\n")[0] and not suite.endswith("Child"):
            gpu_tests.append(f"{suite}.{name}")
            assert any(fnmatch.fnmatchcase(gpu_tests[-1], p) for p in patterns), \
                f"{gpu_tests[-1]} ({os.path.basename(path)}) needs a GPU and is not in the filter {patterns}"
assert len(gpu_tests) >= 20, f"only {len(gpu_tests)} GPU tests found in tests/ops"
print(f"gpu-check dry run: {len(steps)} steps listed in order, the pre-flight and GoogleTest's build first; "
      f"the {len(gpu_tests)} GPU tests of tests/ops in the filter")
PY

# A budget that leaves no room for the tests: neither GoogleTest nor the tests are in the plan, the figures are.
(cd "$tmp/repo" && PATH="$tmp/bin:$PATH" GPU_CHECK_BUDGET=300 bash scripts/gpu-check.sh --dry-run) > "$tmp/run.log" 2>&1 ||
  fail "the short dry run exited $?"
grep -q "no time left to build the tests before the figures" "$tmp/run.log" || fail "the skipped tests were not said"
if grep -q "googletest\|ops_test" "$tmp/run.log"; then fail "GoogleTest or the tests are in a plan without time for them"; fi
grep -q "step, cap .*mixtrain bench gemm --device cuda" "$tmp/run.log" || fail "the figures are not in the short plan"
[ ! -e "$tmp/calls.log" ] || fail "the short dry run ran: $(cat "$tmp/calls.log")"
# An unknown argument: one line, status 2.
set +e
(cd "$tmp/repo" && bash scripts/gpu-check.sh --dry-rn) > "$tmp/run.log" 2>&1
status=$?
set -e
[ "$status" -eq 2 ] && grep -q "unknown argument '--dry-rn'" "$tmp/run.log" || fail "a misspelt flag gave status $status"
echo "gpu-check dry run ok"
