#!/usr/bin/env bash
# `mixtrain train --model mlp --policy mixed_float8` with both FP8 recipes (and mixed_float8_e4m3) learns a small CSV
# task as mixed_bfloat16 does; a bad --fp8-recipe, or one given with a policy that quantizes nothing, is one line and
# exit status 2.
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
run e4m3 --policy mixed_float8_e4m3 --accumulate 2
ref=$(accuracy "$tmp/bf16.json")
for name in fp8 fp8_current e4m3; do
  [ -s "$tmp/$name.json" ] || continue
  a=$(accuracy "$tmp/$name.json")
  echo "$name test accuracy $a (mixed_bfloat16 $ref)"
  python3 -c "import sys; a, r = map(float, sys.argv[1:]); sys.exit(0 if a > 0.9 and abs(a - r) <= 0.03 else 1)" "$a" "$ref" \
    || fail "$name: accuracy $a against mixed_bfloat16's $ref"
done
grep -q '"policy": *"mixed_float8"' "$tmp/fp8.json" || fail "the report does not name the policy"
expect_refusal() {  # expect_refusal PATTERN FLAGS...
  local pattern="$1"; shift
  "$bin" train --data "$tmp/data.csv" --epochs 1 "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$?
  [ "$status" -eq 2 ] || fail "$*: exit status $status, expected 2"
  grep -q "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "$*: the message does not say '$pattern'"; }
}
expect_refusal "valid recipes: delayed, current" --policy mixed_float8 --fp8-recipe block
expect_refusal "applies to the float8 policies" --policy mixed_bfloat16 --fp8-recipe current
expect_refusal "mixed_float8_e4m3" --policy mixed_float4
exit "$fails"
