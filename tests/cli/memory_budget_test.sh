#!/usr/bin/env bash
# --memory-budget with --memory-plan and a batch given: `train`, `inspect`, `compare` and `bench step` refuse a run
# whose plan exceeds the budget, in one line (the plan's total, the budget, the largest part) with exit status 2
# and before any step; a budget the plan fits runs as without it. The budgets come from the plan of a first run
# (5% below and above its total), not from figures written here. --memory-budget with neither --memory-plan nor
# --batch-size auto is still refused. Fashion-MNIST's MLP; about half a minute on 2 idle cores.
set -u
bin="$1"
. "$(dirname "$0")/lib.sh"
start_checks

mlp=(--hidden 128 --steps 2 --batch-size 256 --policy mixed_bfloat16)
"$bin" train "${mlp[@]}" --memory-plan --json "$tmp/plan.json" > "$tmp/plan.out" || fail "train exited $?"
read -r below above < <(python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['memory_plan']['total_bytes']; \
print(int(t * 0.95), int(t * 1.05))" "$tmp/plan.json")
echo "plan total 5% down and up: $below and $above bytes"

refused() {  # refused NAME COMMAND...: exit 2, one line naming the plan and the budget, no step run
  local name="$1"
  shift
  "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  [ "$rc" = 2 ] || fail "$name under the plan's total: exit $rc, $(cat "$tmp/err")"
  [ "$(wc -l < "$tmp/err")" = 1 ] || fail "$name: not one line: $(cat "$tmp/err")"
  grep -q "error: the memory plan needs [0-9.]* MiB at 256 rows per step, more than the --memory-budget of" "$tmp/err" \
    || fail "$name: the message does not name the plan and the budget: $(cat "$tmp/err")"
  grep -q "^memory plan: " "$tmp/out" || fail "$name: the plan was not printed before the refusal"
  grep -Eq "^(epoch|step|policy|memory: measured)|ms per step|ms/step" "$tmp/out" \
    && fail "$name: it ran after the refusal: $(cat "$tmp/out")"
  echo "ok: $name refused: $(cat "$tmp/err")"
}

echo "== train"
refused train "$bin" train "${mlp[@]}" --memory-plan --memory-budget "$below"
"$bin" train "${mlp[@]}" --memory-plan --memory-budget "$above" --json "$tmp/fits.json" > "$tmp/out" 2>&1 \
  || fail "train within the budget exited $?: $(cat "$tmp/out")"
python3 - "$tmp/fits.json" "$above" <<'PY' || fail "train within the budget"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["memory_plan"]["total_bytes"] <= int(sys.argv[2]), r["memory_plan"]
assert len(r["step_loss"]) == 2, r["step_loss"]
print("ok: train within the budget ran its 2 steps")
PY

echo "== inspect and compare"
refused inspect "$bin" inspect --hidden 128 --batch-size 256 --steps 1 --policy mixed_bfloat16 --memory-plan \
  --memory-budget "$below"
refused compare "$bin" compare --hidden 128 --steps 2 --batch-size 256 --policies mixed_bfloat16 --baseline-seeds 1 \
  --memory-plan --memory-budget "$below" --out "$tmp/cmp"

echo "== bench step"
"$bin" bench step --model mlp --hidden 256 --batch-size 64 --steps 1 --policy mixed_float16 --memory-plan \
  --json "$tmp/b.json" > "$tmp/b.out" || fail "bench step exited $?"
read -r bbelow babove < <(python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['memory_plan']['total_bytes']; \
print(int(t * 0.95), int(t * 1.05))" "$tmp/b.json")
"$bin" bench step --model mlp --hidden 256 --batch-size 64 --steps 1 --policy mixed_float16 --memory-plan \
  --memory-budget "$bbelow" > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q "the memory plan needs [0-9.]* MiB at 64 rows per step, more than the --memory-budget" "$tmp/err" \
  && ! grep -q "^memory: measured" "$tmp/out" || fail "bench step under the plan: exit $rc, $(cat "$tmp/err")"
"$bin" bench step --model mlp --hidden 256 --batch-size 64 --steps 1 --policy mixed_float16 --memory-plan \
  --memory-budget "$babove" > "$tmp/out" 2>&1 && grep -q "^memory: measured peak" "$tmp/out" \
  || fail "bench step within the budget: $(cat "$tmp/out")"

echo "== a budget that would do nothing is refused"
for cmd in "train --steps 1" "bench step --steps 1"; do
  # shellcheck disable=SC2086
  "$bin" $cmd --memory-budget 1G > /dev/null 2> "$tmp/err"
  rc=$?
  [ "$rc" = 2 ] && grep -q -- "--memory-budget needs .*--memory-plan" "$tmp/err" \
    || fail "$cmd --memory-budget without --memory-plan: exit $rc, $(cat "$tmp/err")"
done
exit "$fails"
