#!/usr/bin/env bash
# `mixtrain doctor`: a human report on stdout, a --json object with the documented fields (each GPU's GEMM
# measurement, or why there is none), and exit status 2 for bad flags without leaving a file behind.
set -eu
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" doctor --seconds 0.3 --json "$tmp/doctor.json" >"$tmp/out"
cat "$tmp/out"
for want in "CPU" "features" "AVX512-FP16" "GPU" "backend   CUDA" "multi-GPU NCCL" "GFLOP/s" "float32" "baseline" "mixed_float16" "mixed_bfloat16"; do
  grep -qF -- "$want" "$tmp/out" || { echo "FAIL: doctor output lacks '$want'"; exit 1; }
done

python3 - "$tmp/doctor.json" "$tmp/out" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
for k in ["cpu", "gpus", "measurements", "verdicts", "thresholds", "seconds"]:
    assert k in r, k
cpu = r["cpu"]
for k in ["model_name", "vendor", "logical_cores", "gemm_threads", "gemm_isa", "features"]:
    assert k in cpu, k
for f in ["avx2", "fma", "f16c", "avx512f", "avx512_fp16", "avx512_bf16", "amx_bf16", "amx_fp16"]:
    assert isinstance(cpu["features"][f], bool), f
assert cpu["gemm_isa"] in ("avx512", "avx2", "scalar"), cpu["gemm_isa"]
g = r["gpus"]
assert isinstance(g["driver_found"], bool) and g["status"] and isinstance(g["devices"], list), g
cb = r["cuda_backend"]
assert isinstance(cb["compiled"], bool) and isinstance(cb["loaded"], bool) and cb["detail"], cb
assert cb["loaded"] == (len(cb["ops"]) > 0), cb
assert cb["compiled"] or not cb["loaded"], cb
# NCCL: its version and library where it loads (no GPU needed), else why not; the same line in the text.
assert r["nccl"].startswith("NCCL "), r["nccl"]
assert ("multi-GPU " + r["nccl"]) in open(sys.argv[2]).read(), r["nccl"]
ms = r["measurements"]
assert {m["dtype"] for m in ms} == {"float32", "float16", "bfloat16"}, ms
for m in ms:
    assert math.isfinite(m["gflops"]) and m["gflops"] > 0, m
    assert math.isfinite(m["ratio"]) and m["ratio"] > 0, m
    if m["dtype"] == "float32":
        assert m["ratio"] == 1, m
threshold = r["thresholds"]["recommend_speedup"]
def lines_of(device):
    lines = {v["policy"]: v for v in r["verdicts"] if v["device"] == device}
    assert set(lines) == {"float32", "mixed_float16", "mixed_bfloat16"}, lines
    assert lines["float32"]["verdict"] == "baseline", lines["float32"]
    return lines
def check_measured(v, dtype, withheld=False):  # the verdict of a measured speedup, on any device
    shown = f"{v['speedup']:.2f}"
    if shown.endswith("0") and not shown.endswith(".0"):
        shown = shown[:-1]
    tail = f"({dtype} GEMM measured {shown}x float32)"
    if float(shown) >= threshold - 1e-9 and withheld:  # the CPU's, busy and widening: withheld
        assert v["verdict"] == "inconclusive on a busy machine: stay in float32 until measured on an idle one " + tail, v
    elif float(shown) >= threshold - 1e-9:
        assert v["verdict"] == "recommended " + tail, v
    else:
        assert v["verdict"] == "no benefit on this hardware: stay in float32 " + tail, v
cpu_lines = lines_of("cpu")
for policy, dtype in [("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")]:
    # On a busy machine a recommendation is withheld where the GEMM widens the dtype to float32.
    method = r["cpu"]["gemm_f16_method"] if dtype == "float16" else r["cpu"]["gemm_bf16_method"]
    sixteen = method in (("fp16", "amx") if dtype == "float16" else ("dot", "amx"))
    check_measured(cpu_lines[policy], dtype, withheld=r["busy"] and not sixteen)
assert isinstance(cb["device_count"], int), cb
# Each GPU: measured through the CUDA backend when it can be (verdicts by the CPU's rule), else why not.
usable = cb["loaded"] and "bmm" in cb["ops"] and cb["device_count"] == len(g["devices"])
measured_gpus = 0
for i, d in enumerate(g["devices"]):
    gm, lines = d["gemm"], lines_of(f"gpu{i}")
    assert gm["device"] == f"gpu{i}", gm
    if not gm["measurements"]:
        assert gm["not_measured"], gm
        assert not usable or "float32 GEMM failed" in gm["not_measured"], gm
        assert all(v["speedup"] is None for v in lines.values()), lines
        continue
    measured_gpus += 1
    f32 = gm["measurements"][0]
    assert f32["dtype"] == "float32" and f32["ratio"] == 1 and gm["method"].startswith("cublaslt"), gm
    for m in gm["measurements"]:
        assert m["size"] == 4096 and m["repetitions"] >= 2 and math.isfinite(m["gflops"]) and m["gflops"] > 0, m
        assert math.isclose(m["ratio"], m["gflops"] / f32["gflops"], rel_tol=1e-9), m
        if m["dtype"] != "float32":
            v = lines["mixed_" + m["dtype"]]
            assert math.isclose(v["speedup"], m["ratio"], rel_tol=1e-9), (v, m)
            check_measured(v, m["dtype"])
    print(f"gpu{i} measured:", {p: v["verdict"] for p, v in lines.items()})
text = open(sys.argv[2]).read()
assert ("\nGEMM on gpu" in text) == (measured_gpus > 0), measured_gpus
print("doctor json ok:", {p: v["verdict"] for p, v in cpu_lines.items()})
PY

# Bad flags and an unwritable --json path: exit 2, a one-line error, no JSON file left behind.
expect_bad() {
  set +e
  "$bin" doctor "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "FAIL: doctor $* exited $rc, expected 2"; cat "$tmp/err"; exit 1; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { echo "FAIL: doctor $*: error is not one line"; cat "$tmp/err"; exit 1; }
  [ ! -e "$tmp/bad.json" ] || { echo "FAIL: doctor $* wrote a JSON file"; exit 1; }
  echo "ok: doctor $* -> $(cat "$tmp/err")"
}
expect_bad --seconds 0 --json "$tmp/bad.json"
expect_bad --seconds -1 --json "$tmp/bad.json"
expect_bad --seconds abc --json "$tmp/bad.json"
expect_bad --bogus 1 --json "$tmp/bad.json"
expect_bad --json
expect_bad --seconds 0.05 --json "$tmp/no-such-dir/bad.json"
ls "$tmp/no-such-dir" 2>/dev/null && { echo "FAIL: a directory appeared"; exit 1; }
echo "doctor cli ok"
