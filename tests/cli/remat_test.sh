#!/usr/bin/env bash
# --remat blocks end to end: a tiny transformer with dropout on the first 100,000 characters of Moby Dick trains 30
# steps under mixed_float16 (loss scaling) with and without recomputation: the step losses and the validation loss
# are the same bits, with the recovery ladder (--recover) watching too; the checkpoint records "blocks" (a run
# without it records nothing); a recomputing run resumed after 15 steps ends bit-identical to the uninterrupted one;
# bench step of the transformer and the resnet reports its choice and a smaller peak with it; --remat activations
# (GELU outputs made again) gives the same bits, is recorded, and lowers the transformer's peak; a bad value and the
# flag on another model are one-line errors with exit status 2. About a minute on 2 idle cores.
set -u
bin="$1"
. "$(dirname "$0")/lib.sh"
require_moby_dick
start_checks
python3 - "$(moby_dick_path)" "$tmp/moby.txt" <<'PY'
import sys
open(sys.argv[2], "w", encoding="utf-8").write(open(sys.argv[1], encoding="utf-8").read()[:100000])
PY
small=(--model transformer --data "text:$tmp/moby.txt" --context 32 --width 32 --layers 2 --heads 2 --batch-size 16
       --dropout 0.1 --seed 3 --policy mixed_float16 --lr-schedule constant --warmup-steps 0 --eval-every 15)

header_field() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
print(json.loads(header["__metadata__"]["config"]).get(sys.argv[2], ""))
PY
}

same_run() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["step_loss"] and a["step_loss"] == b["step_loss"], "the step losses differ"
assert [e["val_loss"] for e in a["epochs"]] == [e["val_loss"] for e in b["epochs"]], (a["epochs"], b["epochs"])
PY
}

echo "== recomputed and kept: the same bits"
"$bin" train "${small[@]}" --steps 30 --remat blocks --save "$tmp/remat.safetensors" --json "$tmp/remat.json" \
  > /dev/null || fail "train --remat blocks exited $?"
"$bin" train "${small[@]}" --steps 30 --save "$tmp/kept.safetensors" --json "$tmp/kept.json" > /dev/null \
  || fail "train exited $?"
same_run "$tmp/kept.json" "$tmp/remat.json" || fail "recomputed and kept runs differ"
[ "$(header_field "$tmp/remat.safetensors" remat)" = "blocks" ] || fail "--remat blocks is not recorded"
[ "$(header_field "$tmp/kept.safetensors" remat)" = "" ] || fail "a run without --remat records one"

echo "== GELU outputs made again (--remat activations) and kept: the same bits"
"$bin" train "${small[@]}" --steps 30 --remat activations --save "$tmp/act.safetensors" --json "$tmp/act.json" \
  > /dev/null || fail "train --remat activations exited $?"
same_run "$tmp/kept.json" "$tmp/act.json" || fail "runs with and without --remat activations differ"
[ "$(header_field "$tmp/act.safetensors" remat)" = "activations" ] || fail "--remat activations is not recorded"

echo "== the recovery ladder (--recover: an observer on every layer) sees the same run"
"$bin" train "${small[@]}" --steps 15 --recover --remat blocks --json "$tmp/recover_remat.json" > /dev/null \
  || fail "train --recover --remat blocks exited $?"
"$bin" train "${small[@]}" --steps 15 --recover --json "$tmp/recover_kept.json" > /dev/null \
  || fail "train --recover exited $?"
same_run "$tmp/recover_kept.json" "$tmp/recover_remat.json" || fail "recomputed and kept runs under --recover differ"

echo "== a recomputing run resumed after 15 steps"
"$bin" train "${small[@]}" --steps 15 --remat blocks --save "$tmp/half.safetensors" > /dev/null \
  || fail "the first half exited $?"
"$bin" train "${small[@]}" --steps 30 --remat blocks --resume "$tmp/half.safetensors" --json "$tmp/resumed.json" \
  > /dev/null || fail "resume exited $?"
same_run "$tmp/remat.json" "$tmp/resumed.json" || fail "the resumed run differs"

echo "== bench step"
for model in transformer resnet; do
  "$bin" bench step --model $model --batch-size 8 --steps 1 --json "$tmp/none.json" > /dev/null \
    || fail "bench step --model $model exited $?"
  "$bin" bench step --model $model --batch-size 8 --steps 1 --remat blocks --json "$tmp/blocks.json" > /dev/null \
    || fail "bench step --model $model --remat blocks exited $?"
  python3 - "$tmp/none.json" "$tmp/blocks.json" <<'PY' || fail "bench step --model $model: remat not in force"
import json, sys
none, blocks = (json.load(open(p)) for p in sys.argv[1:])
assert none["remat"] == "none" and blocks["remat"] == "blocks", (none["remat"], blocks["remat"])
assert blocks["step_peak_memory_bytes"] < none["step_peak_memory_bytes"], \
    (blocks["step_peak_memory_bytes"], none["step_peak_memory_bytes"])
print("peak", none["step_peak_memory_bytes"], "->", blocks["step_peak_memory_bytes"])
PY
done
"$bin" bench step --model transformer --batch-size 8 --steps 1 --json "$tmp/none.json" > /dev/null \
  || fail "bench step --model transformer exited $?"
"$bin" bench step --model transformer --batch-size 8 --steps 1 --remat activations --json "$tmp/act.json" \
  > /dev/null || fail "bench step --remat activations exited $?"
python3 - "$tmp/none.json" "$tmp/act.json" <<'PY' || fail "bench step --remat activations: not in force"
import json, sys
none, act = (json.load(open(p)) for p in sys.argv[1:])
assert act["remat"] == "activations", act["remat"]
assert act["step_peak_memory_bytes"] < none["step_peak_memory_bytes"], \
    (act["step_peak_memory_bytes"], none["step_peak_memory_bytes"])
print("peak", none["step_peak_memory_bytes"], "->", act["step_peak_memory_bytes"], "(activations)")
PY

echo "== one-line errors, exit status 2"
expect_usage_error() {
  local want="$1"; shift
  "$bin" "$@" > /dev/null 2> "$tmp/err"; local rc=$?
  [ "$rc" = 2 ] && grep -qF -- "$want" "$tmp/err" && [ "$(wc -l < "$tmp/err")" = 1 ] \
    || fail "mixtrain $*: exit $rc, $(cat "$tmp/err")"
}
expect_usage_error "--remat must be blocks, activations or none, got 'layers'" train "${small[@]}" --remat layers \
  --steps 1
expect_usage_error "--remat must be blocks, activations or none, got 'all'" bench step --model transformer --remat all
expect_usage_error "--remat activations makes the GELU MLP's hidden values again: it needs --model transformer with" \
  bench step --model resnet --remat activations
expect_usage_error "--remat activations makes the GELU MLP's hidden values again: it needs --model transformer with" \
  train "${small[@]}" --mlp swiglu --remat activations --steps 1
expect_usage_error "--remat applies to --model transformer and resnet only, got --model mlp" train --model mlp \
  --data "text:$tmp/moby.txt" --remat blocks --steps 1
expect_usage_error "--remat applies to --model transformer and resnet only, got --model mlp" bench step --remat blocks
exit "$fails"
