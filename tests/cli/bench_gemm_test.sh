#!/usr/bin/env bash
# `mixtrain bench gemm --device`: cpu (the default) prints the table and JSON it always did, and `--device cpu`
# the same; a malformed device exits 2 naming the valid forms; `--device cuda` either times the GPU GEMM (a
# machine with a GPU and a build with the CUDA backend) or exits 2 saying what is missing, never writing the JSON.
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
export OMP_NUM_THREADS=1

# The CPU table, without --device and with --device cpu: the same lines once the measured figures are masked.
# The figures' widths vary with them ("97.9" and "100.7" in one 10-wide column), so the padding goes too.
mask() { sed -E 's/^( *[0-9]+  [a-z0-9]+) +[0-9.]+ +[0-9.]+x /\1 G R /' "$1"; }
"$bin" bench gemm --sizes 48,65 --seconds 0.02 --json "$tmp/default.json" >"$tmp/default.out" 2>"$tmp/err" ||
  fail "bench gemm exited $?: $(cat "$tmp/err")"
"$bin" bench gemm --sizes 48,65 --seconds 0.02 --json "$tmp/cpu.json" --device cpu >"$tmp/cpu.out" 2>"$tmp/err" ||
  fail "bench gemm --device cpu exited $?: $(cat "$tmp/err")"
cat "$tmp/cpu.out"
if ! diff <(mask "$tmp/default.out" | sed "s|$tmp/default.json|JSON|") \
          <(mask "$tmp/cpu.out" | sed "s|$tmp/cpu.json|JSON|") >"$tmp/diff"; then
  fail "--device cpu changed the output:"; cat "$tmp/diff"
fi
# The format itself: two header lines, the column line, a row per size and dtype, the JSON line.
grep -qE '^GEMM \(n x n x n\), isa (avx512|avx2|scalar), best of repeated runs over 0\.0 s per case$' "$tmp/cpu.out" ||
  fail "the first line changed"
grep -qE '^methods: bfloat16 [a-z0-9]+, float16 [a-z0-9]+ \(float32 every [0-9]+ k on fp16\); AMX tile state ' \
  "$tmp/cpu.out" || fail "the methods line changed"
grep -qxF '     n  dtype        GFLOP/s  vs float32  method' "$tmp/cpu.out" || fail "the column line changed"
[ "$(grep -cE '^ +(48|65)  (float32|float16|bfloat16) +[0-9.]+ +[0-9.]+x  [a-z0-9]+$' "$tmp/cpu.out")" -eq 6 ] ||
  fail "not 6 rows of n, dtype, GFLOP/s, ratio, method"
[ "$(wc -l <"$tmp/cpu.out")" -eq 10 ] || fail "$(wc -l <"$tmp/cpu.out") lines, expected 10"
python3 - "$tmp/default.json" "$tmp/cpu.json" <<'PY' || fails=$((fails+1))
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    assert set(r) == {"isa", "bf16_method", "f16_method", "amx_status", "gemm"}, sorted(r)
    assert [(g["n"], g["dtype"]) for g in r["gemm"]] == [(n, d) for n in (48, 65)
                                                         for d in ("float32", "float16", "bfloat16")], r["gemm"]
    for g in r["gemm"]:
        assert set(g) == {"n", "dtype", "gflops", "ratio_vs_float32", "method"}, g
        assert g["gflops"] > 0, g
print("cpu json ok")
PY

# expect_error MESSAGE ARGS...: exit status 2, a one-line error holding MESSAGE, no JSON written.
expect_error() {
  local want="$1"; shift
  rm -f "$tmp/bad.json"
  "$bin" bench gemm "$@" --json "$tmp/bad.json" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "bench gemm $* exited $rc, expected 2: $(cat "$tmp/err")"; return; fi
  grep -qF -- "$want" "$tmp/err" || { fail "bench gemm $*: stderr lacks '$want': $(cat "$tmp/err")"; return; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { fail "bench gemm $*: the error is not one line"; cat "$tmp/err"; return; }
  [ ! -e "$tmp/bad.json" ] || { fail "bench gemm $* wrote its JSON"; return; }
  echo "ok: bench gemm $* -> $(cat "$tmp/err")"
}
for bad in gpu cuda: cuda:x cuda:-1 cuda:1024 CPU "cuda 0" cuda:0x; do
  expect_error "--device: unknown device '$bad' (valid devices are cpu, cuda and cuda:N)" --device "$bad"
done
expect_error "--device: unknown device '' (valid devices are cpu, cuda and cuda:N)" --device=

# Whether this build and machine run the GPU GEMM: the backend loaded with its matmul kernel (doctor says).
"$bin" doctor --seconds 0.05 --json "$tmp/doctor.json" >/dev/null 2>&1 || fail "doctor exited $?"
gpus=$(python3 -c '
import json, sys
cb = json.load(open(sys.argv[1]))["cuda_backend"]
print(cb["device_count"] if cb["loaded"] and "bmm" in cb["ops"] else 0)
' "$tmp/doctor.json") || fail "doctor --json lacks cuda_backend.device_count"
if [ "$gpus" -eq 0 ]; then
  # No GPU GEMM: what is missing, where, and what was expected; flags are still checked first.
  for dev in cuda cuda:0 cuda:3; do
    named=$dev
    [ "$dev" = cuda ] && named=cuda:0
    expect_error "bench gemm --device $named: no GPU GEMM here: " --device "$dev" --sizes 64
    grep -qF -- "(--device cpu (the default) runs on the CPU; --device cuda needs a build with the CUDA backend" \
      "$tmp/err" || fail "the error of --device $dev lacks the expected set-up: $(cat "$tmp/err")"
  done
  expect_error "--sizes" --device cuda --sizes 0
  expect_error "--seconds must be positive" --device cuda --seconds 0
else
  echo "GPU GEMM available on $gpus GPU(s): timing it"
  "$bin" bench gemm --device cuda --sizes 256 --seconds 0.05 --json "$tmp/gpu.json" >"$tmp/gpu.out" 2>"$tmp/err" ||
    fail "bench gemm --device cuda exited $?: $(cat "$tmp/err")"
  cat "$tmp/gpu.out"
  grep -qE '^GEMM \(n x n x n\) on cuda:0, .+, best of repeated runs over 0\.1 s per case$' "$tmp/gpu.out" ||
    grep -qE '^GEMM \(n x n x n\) on cuda:0, .+, best of repeated runs over 0\.0 s per case$' "$tmp/gpu.out" ||
    fail "the GPU table's first line"
  grep -qxF '     n  dtype        GFLOP/s  vs float32  method' "$tmp/gpu.out" || fail "the GPU column line"
  [ "$(grep -cE '^ +256  (float32|float16|bfloat16) +[0-9.]+ +[0-9.]+x  cublaslt' "$tmp/gpu.out")" -ge 2 ] ||
    fail "the GPU rows"
  python3 - "$tmp/gpu.json" <<'PY' || fails=$((fails+1))
import json, sys
r = json.load(open(sys.argv[1]))
assert r["device"] == "cuda:0" and r["gpu"], r
rows = {g["dtype"]: g for g in r["gemm"]}
assert rows["float32"]["gflops"] > 0 and rows["float32"]["ratio_vs_float32"] == 1, rows
for g in r["gemm"]:
    if g["gflops"] is not None:
        assert g["method"].startswith("cublaslt") and g["batches"] >= 2 and g["per_batch"] >= 1, g
print("gpu json ok")
PY
  expect_error "bench gemm --device cuda:$gpus: no GPU GEMM here: cuda:$gpus does not exist" --device "cuda:$gpus"
fi

# --float8: the same rows and, per size, the FP8 GEMM of E4M3 and E5M2 operands on the bfloat16 method, scaled.
"$bin" bench gemm --sizes 48,65 --seconds 0.02 --float8 --json "$tmp/fp8.json" >"$tmp/fp8.out" 2>"$tmp/err" ||
  fail "bench gemm --float8 exited $?: $(cat "$tmp/err")"
cat "$tmp/fp8.out"
[ "$(grep -cE '^ +(48|65)  (float32|float16|bfloat16) +[0-9.]+ +[0-9.]+x  [a-z0-9]+$' "$tmp/fp8.out")" -eq 6 ] ||
  fail "--float8: not the 6 rows of the other dtypes"
[ "$(grep -cE '^ +(48|65)  float8_(e4m3fn|e5m2) +[0-9.]+ +[0-9.]+x  [a-z0-9]+ scaled$' "$tmp/fp8.out")" -eq 4 ] ||
  fail "--float8: not 4 float8 rows"
python3 - "$tmp/fp8.json" <<'PY' || fails=$((fails+1))
import json, sys
r = json.load(open(sys.argv[1]))
assert [(g["n"], g["dtype"]) for g in r["gemm"]] == [(n, d) for n in (48, 65) for d in (
    "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")], r["gemm"]
assert all(g["gflops"] > 0 for g in r["gemm"]), r["gemm"]
PY
expect_error "bench gemm --float8 times the CPU's FP8 GEMM" --float8 --device cuda

[ "$fails" -eq 0 ] && echo "bench gemm cli ok"
exit "$fails"
