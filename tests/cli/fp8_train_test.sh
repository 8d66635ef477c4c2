#!/usr/bin/env bash
# `mixtrain train --model mlp --policy mixed_float8` with the three FP8 recipes (and mixed_float8_e4m3) learns a small CSV
# task as mixed_bfloat16 does; inspect shows the FP8 tensors (a transformer's attention: both of its projections),
# doctor says how FP8 runs, compare judges the float8 policies; a bad --fp8-recipe, or one given with a policy that
# quantizes nothing, is one line and exit status 2.
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
start_checks
python3 - "$tmp/data.csv" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    f.write("f1,f2,f3,f4,label\n")
    for i in range(900):
        c = i % 3
        f.write(",".join(f"{random.gauss(2.0 if j == c else 0.0, 0.7):.4f}" for j in range(4)) + f",{c}\n")
PY
accuracy() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test']['accuracy'])" "$1"; }
run() {  # run NAME FLAGS...: trains, writes $tmp/NAME.json
  local name="$1"; shift
  "$bin" train --model mlp --data "$tmp/data.csv" --epochs 3 --batch-size 32 --seed 2 --hidden 32,16 \
    --json "$tmp/$name.json" "$@" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "$name: exit status $?"; }
}
run bf16 --policy mixed_bfloat16
run fp8 --policy mixed_float8
run fp8_current --policy mixed_float8 --fp8-recipe current
run fp8_block --policy mixed_float8 --fp8-recipe block
run e4m3 --policy mixed_float8_e4m3 --accumulate 2
ref=$(accuracy "$tmp/bf16.json")
for name in fp8 fp8_current fp8_block e4m3; do
  [ -s "$tmp/$name.json" ] || continue
  a=$(accuracy "$tmp/$name.json")
  echo "$name test accuracy $a (mixed_bfloat16 $ref)"
  python3 -c "import sys; a, r = map(float, sys.argv[1:]); sys.exit(0 if a > 0.9 and abs(a - r) <= 0.03 else 1)" "$a" "$ref" \
    || fail "$name: accuracy $a against mixed_bfloat16's $ref"
done
grep -q '"policy": *"mixed_float8"' "$tmp/fp8.json" || fail "the report does not name the policy"
# inspect shows each FP8 layer's quantized tensors (text and --json); the float32 output layer has none.
"$bin" inspect --data "$tmp/data.csv" --policy mixed_float8 --hidden 32,16 --epochs 1 --batch-size 32 \
  --json "$tmp/inspect.json" >"$tmp/inspect.log" 2>&1 || { cat "$tmp/inspect.log"; fail "inspect: exit status $?"; }
grep -q '\[fp8 grad\] *e5m2 *| amax' "$tmp/inspect.log" || { cat "$tmp/inspect.log"; fail "inspect shows no FP8 rows"; }
python3 - "$tmp/inspect.json" <<'PY' || fail "inspect --json: FP8 entries"
import json, sys
layers = json.load(open(sys.argv[1]))["layers"]
for l in layers[:2]:
    rows = {r["tensor"]: r for r in l["fp8"]}
    assert sorted(rows) == ["grad", "input", "weight"], l["layer"]
    assert rows["input"]["format"] == "float8_e4m3fn" and rows["grad"]["format"] == "float8_e5m2"
    for r in rows.values():
        assert r["amax"] > 0 and r["scale"] > 1 and 0 <= r["saturated_fraction"] <= 1 and 0 <= r["flushed_fraction"] <= 1, r
assert layers[-1]["fp8"] == [], "the float32 output layer quantizes nothing"
PY
# A transformer's attention quantizes two GEMMs: inspect lists both under block_1/attention, named after them.
python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(7)
words = ["the", "whale", "sea", "ship", "captain", "white", "water", "deep", "night", "storm"]
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(3000)))
PY
"$bin" inspect --model transformer --data "text:$tmp/text.txt" --context 16 --width 16 --layers 1 --heads 2 \
  --batch-size 8 --steps 2 --policy mixed_float8 --json "$tmp/inspect_lm.json" >"$tmp/inspect_lm.log" 2>&1 \
  || { cat "$tmp/inspect_lm.log"; fail "inspect --model transformer: exit status $?"; }
grep -q '\[fp8 query_key_value/input\] *e4m3 *| amax' "$tmp/inspect_lm.log" \
  || { cat "$tmp/inspect_lm.log"; fail "inspect shows no FP8 rows for the attention's projections"; }
python3 - "$tmp/inspect_lm.json" <<'PY' || fail "inspect --json: the attention's FP8 entries"
import json, sys
layers = {l["layer"]: l for l in json.load(open(sys.argv[1]))["layers"]}
rows = {r["tensor"]: r for r in layers["block_1/attention"]["fp8"]}
want = [g + "/" + t for g in ("query_key_value", "attention_output") for t in ("input", "weight", "grad")]
assert sorted(rows) == sorted(want), sorted(rows)
for name, r in rows.items():
    assert r["format"] == ("float8_e5m2" if name.endswith("grad") else "float8_e4m3fn"), (name, r)
    assert r["amax"] > 0 and 0 <= r["saturated_fraction"] <= 1 and 0 <= r["flushed_fraction"] <= 1, (name, r)
print("inspect lists the attention's FP8 rows:", ", ".join(sorted(rows)))
PY
# doctor says how FP8 runs here; compare judges the float8 policies against float32's band.
"$bin" doctor --seconds 0.2 >"$tmp/doctor.log" 2>&1 || fail "doctor: exit status $?"
grep -q '^FP8       cpu: emulated' "$tmp/doctor.log" || { cat "$tmp/doctor.log"; fail "doctor has no FP8 line"; }
"$bin" compare --data "$tmp/data.csv" --hidden 32,16 --epochs 2 --batch-size 32 --seed 2 --baseline-seeds 2 \
  --policies float32,mixed_bfloat16,mixed_float8,mixed_float8_e4m3 --out "$tmp/compare" >"$tmp/compare.log" 2>&1 \
  || { tail -20 "$tmp/compare.log"; fail "compare with the float8 policies: exit status $?"; }
python3 - "$tmp/compare/report.json" <<'PY' || fail "compare's report judges the float8 policies"
import json, sys
p = json.load(open(sys.argv[1]))["policies"]
for name in ("mixed_float8", "mixed_float8_e4m3"):
    assert p[name]["numerics_verdict"], name
    print(name, p[name]["verdict"], p[name]["test"])
PY
expect_refusal() {  # expect_refusal PATTERN FLAGS...
  local pattern="$1"; shift
  "$bin" train --data "$tmp/data.csv" --epochs 1 "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$?
  [ "$status" -eq 2 ] || fail "$*: exit status $status, expected 2"
  grep -q "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "$*: the message does not say '$pattern'"; }
}
expect_refusal "valid recipes: delayed, current, block" --policy mixed_float8 --fp8-recipe mxfp8
expect_refusal "applies to the float8 policies" --policy mixed_bfloat16 --fp8-recipe current
expect_refusal "mixed_float8_e4m3" --policy mixed_float4
exit "$fails"
