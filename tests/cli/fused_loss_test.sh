#!/usr/bin/env bash
# The transformer's fused logits and loss (--fused-loss, on by default) end to end: a tiny model on the first
# 100,000 characters of Moby Dick trains 40 steps with it on and off under mixed_bfloat16 and mixed_float16; the
# validation loss falls and the step losses agree to float32 rounding (they drift apart only through the 16-bit
# roundings of weights that differ in their last float32 bits: 1% after 40 steps is far more than that, far less
# than a wrong gradient); the checkpoint records the choice, a run resumed after 20 steps ends bit-identical to the
# uninterrupted one, and `generate` works from the checkpoint alone; a bad value and the flag on another model are
# one-line errors with exit status 2. About a minute on 2 idle cores.
set -u
bin="$1"
. "$(dirname "$0")/lib.sh"
require_moby_dick
start_checks
python3 - "$(moby_dick_path)" "$tmp/moby.txt" <<'PY'
import sys
open(sys.argv[2], "w", encoding="utf-8").write(open(sys.argv[1], encoding="utf-8").read()[:100000])
PY
small=(--model transformer --data "text:$tmp/moby.txt" --context 32 --width 32 --layers 1 --heads 2 --batch-size 16
       --seed 3 --lr-schedule constant --warmup-steps 0 --eval-every 20)

header_field() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
print(json.loads(header["__metadata__"]["config"]).get(sys.argv[2], ""))
PY
}

for policy in mixed_bfloat16 mixed_float16; do
  echo "== $policy: fused on (the default) and off"
  "$bin" train "${small[@]}" --steps 40 --policy $policy --save "$tmp/on.safetensors" --json "$tmp/on.json" > /dev/null \
    || fail "$policy: train exited $?"
  "$bin" train "${small[@]}" --steps 40 --policy $policy --fused-loss off --save "$tmp/off.safetensors" --json "$tmp/off.json" \
    > /dev/null || fail "$policy: train --fused-loss off exited $?"
  python3 - "$tmp/on.json" "$tmp/off.json" <<'PY' || fail "$policy: fused and unfused runs disagree"
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:])
v = [e["val_loss"] for e in on["epochs"]]
assert len(v) == 2 and v[-1] < v[0], v
assert on["step_loss"][0] != 0 and abs(on["step_loss"][0] - off["step_loss"][0]) <= 1e-5 * off["step_loss"][0], \
    (on["step_loss"][0], off["step_loss"][0])
worst = max(abs(a - b) / b for a, b in zip(on["step_loss"], off["step_loss"]))
assert worst < 1e-2, worst
print("validation loss", [round(x, 4) for x in v], "largest step-loss difference", worst)
PY
  [ "$(header_field "$tmp/on.safetensors" fused_loss)" = "True" ] || fail "$policy: on is not recorded"
  [ "$(header_field "$tmp/off.safetensors" fused_loss)" = "False" ] || fail "$policy: off is not recorded"
done

echo "== resume and generate"
"$bin" train "${small[@]}" --policy mixed_bfloat16 --steps 20 --save "$tmp/half.safetensors" > /dev/null \
  || fail "the first half exited $?"
"$bin" train "${small[@]}" --steps 40 --policy mixed_bfloat16 --resume "$tmp/half.safetensors" --json "$tmp/resumed.json" \
  > /dev/null || fail "resume exited $?"
"$bin" train "${small[@]}" --steps 40 --policy mixed_bfloat16 --save "$tmp/full.safetensors" --json "$tmp/full.json" > /dev/null
python3 - "$tmp/full.json" "$tmp/resumed.json" <<'PY' || fail "the resumed run differs"
import json, sys
full, resumed = (json.load(open(p)) for p in sys.argv[1:])
assert full["step_loss"] == resumed["step_loss"], "the resumed steps differ"
assert full["epochs"][-1]["val_loss"] == resumed["epochs"][-1]["val_loss"]
PY
gen() { "$bin" generate --checkpoint "$tmp/full.safetensors" --prompt "The whale" --tokens 40 --seed 5 "$@"; }
gen > "$tmp/gen" || fail "generate exited $?"
gen > "$tmp/gen2"
cmp -s "$tmp/gen" "$tmp/gen2" || fail "one seed gave two texts"
grep -q "^The whale" "$tmp/gen" || fail "the text does not start with the prompt"
[ "$(wc -c < "$tmp/gen")" -gt 30 ] || fail "generate wrote too little: $(cat "$tmp/gen")"

echo "== one-line errors, exit status 2"
"$bin" train "${small[@]}" --fused-loss maybe --steps 1 > /dev/null 2> "$tmp/err"; rc=$?
[ "$rc" = 2 ] && grep -q -- "--fused-loss must be on or off" "$tmp/err" || fail "--fused-loss maybe: exit $rc, $(cat "$tmp/err")"
"$bin" train --model mlp --data "text:$tmp/moby.txt" --fused-loss on --steps 1 > /dev/null 2> "$tmp/err"; rc=$?
[ "$rc" = 2 ] && grep -q -- "--fused-loss applies to --model transformer only" "$tmp/err" \
  || fail "--fused-loss on mlp: exit $rc, $(cat "$tmp/err")"
exit "$fails"
