#!/usr/bin/env bash
# --memory-plan end to end: `train` on a slice of Moby Dick (a transformer past one attention tile, so the tiled
# attention trains and the full one evaluates) and on Fashion-MNIST's MLP, and `bench step`, each print the plan
# before the steps and the measured peak beside it after; --json carries both; the plan is within 10% of the
# measurement; `inspect` prints the plan `train` makes for the same flags; `compare` gives each --policies entry its
# own optimizer settings (its plan shows them). A switch takes no value. About half a minute on 2 idle cores.
set -u
bin="$1"
. "$(dirname "$0")/lib.sh"
require_moby_dick
start_checks
python3 - "$(moby_dick_path)" "$tmp/moby.txt" <<'PY'
import sys
open(sys.argv[2], "w", encoding="utf-8").write(open(sys.argv[1], encoding="utf-8").read()[:60000])
PY

check_json() {  # the JSON's plan within 10% of its measured peak, every part present
  python3 - "$1" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["memory_plan"]
for k in ("weight_bytes", "gradient_bytes", "optimizer_state_bytes", "compute_copy_bytes", "step_bytes",
          "evaluation_bytes", "total_bytes", "measured_peak_bytes"):
    assert k in p, k
assert p["weight_bytes"] > 0 and p["step_bytes"] > 0
ratio = p["total_bytes"] / p["measured_peak_bytes"]
assert abs(ratio - 1) <= 0.10, ratio
print("plan / measured", round(ratio, 4))
PY
}

echo "== train: a transformer at context 160 under mixed_bfloat16"
"$bin" train --model transformer --data "text:$tmp/moby.txt" --context 160 --width 32 --layers 1 --heads 2 \
  --batch-size 8 --steps 3 --eval-every 3 --policy mixed_bfloat16 --memory-plan --json "$tmp/t.json" > "$tmp/t.out" \
  || fail "train exited $?"
grep -q "^memory plan: " "$tmp/t.out" && grep -q "or one validation batch" "$tmp/t.out" \
  && grep -q "^memory: measured peak" "$tmp/t.out" || fail "the plan or the measurement is missing: $(cat "$tmp/t.out")"
check_json "$tmp/t.json" || fail "train's JSON"

echo "== train: the MLP on Fashion-MNIST with bfloat16 optimizer state and accumulation"
"$bin" train --hidden 128 --epochs 1 --batch-size 256 --policy mixed_bfloat16 --optimizer-state bfloat16 \
  --accumulate 2 --memory-plan --json "$tmp/m.json" > "$tmp/m.out" || fail "train exited $?"
check_json "$tmp/m.json" || fail "the MLP's JSON"

echo "== inspect: train's plan for the same flags, before the inspection"
"$bin" inspect --hidden 128 --batch-size 256 --steps 1 --policy mixed_bfloat16 --optimizer-state bfloat16 \
  --accumulate 2 --memory-plan --json "$tmp/i.json" > "$tmp/i.out" || fail "inspect exited $?"
head -1 "$tmp/i.out" | grep -q "^memory plan: " || fail "inspect's plan is missing: $(cat "$tmp/i.out")"
grep -q "^policy mixed_bfloat16, 1 batches" "$tmp/i.out" || fail "the inspection is missing: $(cat "$tmp/i.out")"
python3 - "$tmp/i.json" "$tmp/m.json" <<'PY' || fail "inspect's plan is not train's"
import json, sys
i, m = (json.load(open(f))["memory_plan"] for f in sys.argv[1:])
assert "measured_peak_bytes" not in i, i  # nothing was trained
assert json.load(open(sys.argv[1]))["layers"], "no layers"
for k in ("weight_bytes", "gradient_bytes", "optimizer_state_bytes", "compute_copy_bytes"):
    assert i[k] == m[k], (k, i[k], m[k])
assert abs(i["total_bytes"] / m["total_bytes"] - 1) <= 0.01, (i["total_bytes"], m["total_bytes"])
print("inspect / train plan", round(i["total_bytes"] / m["total_bytes"], 4))
PY

echo "== bench step"
"$bin" bench step --model mlp --hidden 256 --batch-size 64 --steps 1 --policy mixed_float16 --memory-plan \
  --json "$tmp/b.json" > "$tmp/b.out" || fail "bench step exited $?"
grep -q "^memory: measured peak" "$tmp/b.out" || fail "bench step's measurement is missing: $(cat "$tmp/b.out")"
check_json "$tmp/b.json" || fail "bench step's JSON"

echo "== compare: a --policies entry's own optimizer settings reach its run, and only its run"
# Each policy's plan is printed before its run, in order. Adam's moments are 8 bytes a weight in float32, 4 in
# bfloat16 (half); Kahan's compensation adds 2 bytes a weight over the whole arena (5/4). MiB to one decimal: 0.1.
"$bin" compare --model transformer --data "text:$tmp/moby.txt" --context 32 --width 128 --layers 1 --heads 2 \
  --batch-size 8 --steps 2 --eval-every 2 --seed 1 --baseline-seeds 1 --memory-plan --out "$tmp/pe" \
  --policies float32,mixed_bfloat16:optimizer-state=bfloat16,bfloat16:master-rounding=kahan > "$tmp/pe.out" \
  || fail "compare exited $?"
python3 - "$tmp/pe.out" <<'PY' || fail "the entries' settings: $(grep -E '^===|optimizer state' "$tmp/pe.out")"
import re, sys
text = open(sys.argv[1]).read()
runs = re.findall(r"^=== (\S+) ===", text, re.M)
state = [float(v) for v in re.findall(r"^  optimizer state +([0-9.]+) MiB", text, re.M)]
assert runs == ["float32", "mixed_bfloat16:optimizer-state=bfloat16", "bfloat16:master-rounding=kahan"], runs
assert len(state) == 3 and state[0] >= 1.0, state
assert abs(state[1] - state[0] / 2) <= 0.1, state
assert abs(state[2] - state[0] * 5 / 4) <= 0.1, state
print("optimizer state per entry (MiB):", state)
PY

echo "== a switch takes no value"
"$bin" train --memory-plan yes --epochs 1 > /dev/null 2> "$tmp/err"; rc=$?
[ "$rc" = 2 ] || fail "--memory-plan yes: exit $rc, $(cat "$tmp/err")"
exit "$fails"
