#!/usr/bin/env bash
# The transformer language model end to end on real text (the first 200,000 characters of Moby Dick, installed
# by scripts/setup.sh), with a small model so it runs in about a minute: training by steps with periodic
# validation in every policy, generation from each policy's checkpoint, a resumed run bit-identical to an
# uninterrupted one, inspection of the attention logits, and recovery from attention logits that overflow
# float16 by switching exactly the attention layers to float32.
set -eu
bin="$1"
. "$(dirname "$0")/lib.sh"
require_moby_dick
moby=$(moby_dick_path)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$moby" "$tmp/moby.txt" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(text[:200000])
PY
small=(--model transformer --data "text:$tmp/moby.txt" --context 32 --width 32 --layers 1 --heads 2 --batch-size 16)

echo "== train by steps under every policy, save, generate"
for p in float32 mixed_float16 mixed_bfloat16; do
  "$bin" train "${small[@]}" --policy "$p" --steps 60 --eval-every 20 --seed 3 --json "$tmp/$p.json" \
    --save "$tmp/$p.safetensors" | tail -3
  "$bin" generate --checkpoint "$tmp/$p.safetensors" --prompt "The whale" --tokens 40 --seed 5 > "$tmp/$p.gen"
  "$bin" generate --checkpoint "$tmp/$p.safetensors" --prompt "The whale" --tokens 40 --seed 5 > "$tmp/$p.gen2"
  cmp "$tmp/$p.gen" "$tmp/$p.gen2"  # one seed, one text
  cat "$tmp/$p.gen"
done
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
runs = {p: json.load(open(f"{tmp}/{p}.json")) for p in ("float32", "mixed_float16", "mixed_bfloat16")}
for p, r in runs.items():
    ev = r["epochs"]
    assert [e["step"] for e in ev] == [20, 40, 60], (p, ev)
    losses = [e["val_loss"] for e in ev]
    assert losses[-1] < losses[0] < 4.4, (p, losses)  # ln(vocabulary) is about 4.3 at the start
    assert r["tokens_per_second"] > 0 and r["steps"] == 60, p
    gen = open(f"{tmp}/{p}.gen", encoding="utf-8").read()
    assert gen.startswith("The whale") and len(gen.rstrip("\n")) == len("The whale") + 40, (p, gen)
f32 = runs["float32"]["epochs"][-1]["val_loss"]
for p in ("mixed_float16", "mixed_bfloat16"):
    v = runs[p]["epochs"][-1]["val_loss"]
    assert abs(v - f32) / f32 < 0.02, (p, v, f32)
print("validation loss after 60 steps:", {p: round(r["epochs"][-1]["val_loss"], 4) for p, r in runs.items()})
PY

echo "== a run resumed after 20 steps ends bit-identical to the uninterrupted run"
const=(--lr-schedule constant --warmup-steps 0 --policy mixed_float16 --seed 4)
"$bin" train "${small[@]}" "${const[@]}" --steps 40 --eval-every 20 --json "$tmp/full.json" > /dev/null
"$bin" train "${small[@]}" "${const[@]}" --steps 20 --eval-every 20 --save "$tmp/half.safetensors" > /dev/null
"$bin" train "${small[@]}" "${const[@]}" --steps 40 --eval-every 20 --resume "$tmp/half.safetensors" \
  --json "$tmp/resumed.json" > /dev/null
python3 - "$tmp/full.json" "$tmp/resumed.json" <<'PY'
import json, sys
full, resumed = (json.load(open(p)) for p in sys.argv[1:])
assert full["epochs"][-1]["val_loss"] == resumed["epochs"][-1]["val_loss"], (full["epochs"], resumed["epochs"])
# The checkpoint carries the history, so the resumed report holds the first 20 steps too.
assert full["step_loss"] == resumed["step_loss"], "the resumed steps differ"
PY

echo "== inspect shows the attention logits and the LayerNorm inputs"
"$bin" inspect "${small[@]}" --policy mixed_float16 --steps 2 > "$tmp/inspect.txt"
grep -q "block_1/attention (MultiHeadAttention)" "$tmp/inspect.txt"
grep -q "\[attention_logits\]" "$tmp/inspect.txt"
grep -q "\[inputs\]" "$tmp/inspect.txt"

echo "== attention logits that overflow float16: recovery moves exactly the attention layer to float32"
"$bin" train "${small[@]}" --policy mixed_float16 --steps 80 --eval-every 40 --seed 3 \
  --attention-logit-multiplier 1e6 --recover --json "$tmp/hostile.json" | grep -E "recovery|validation" || true
python3 - "$tmp/hostile.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
switched = [e for e in r["recovery"] if e["action"] == "layers_to_float32"]
assert switched and all(e["layers"] == ["block_1/attention"] for e in switched), r["recovery"]
assert r["layer_compute_dtypes"]["block_1/attention"] == "float32"
assert r["layer_compute_dtypes"]["block_1/mlp_in"] == "float16"
assert math.isfinite(r["epochs"][-1]["val_loss"]), r["epochs"]
PY

echo "== the same without --recover ends non-finite: exit status 3 and a message on stderr"
set +e
"$bin" train "${small[@]}" --policy mixed_float16 --steps 20 --eval-every 20 --seed 3 \
  --attention-logit-multiplier 1e6 > "$tmp/nan.out" 2> "$tmp/nan.err"; rc=$?
set -e
cat "$tmp/nan.err"
[ "$rc" -eq 3 ] && grep -q "training ended with a non-finite loss" "$tmp/nan.err"

echo "== bad input"
set +e
"$bin" train --data "text:$tmp/moby.txt" --epochs 1 2> "$tmp/err"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "train it with --model transformer" "$tmp/err"
set +e
"$bin" generate --checkpoint "$tmp/float32.safetensors" --prompt "日本" 2> "$tmp/err"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "is not in the model's vocabulary" "$tmp/err"
echo "transformer end to end: ok"
