#!/usr/bin/env bash
# The transformer's modern blocks end to end (--norm rms, --mlp swiglu, --positions rope, and all three): a tiny
# model on the first 100,000 characters of Moby Dick trains 40 steps and its validation loss falls; the checkpoint
# records the blocks, a run resumed after 20 steps ends bit-identical to the uninterrupted one, and `generate`
# rebuilds the model from the checkpoint alone (the same text twice for one seed); bad values and the flags on
# another model are one-line errors with exit status 2. About a minute and a half on 2 cores.
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
       --seed 3 --policy mixed_bfloat16 --lr-schedule constant --warmup-steps 0)

# header_field FILE KEY: a field of the run configuration in a checkpoint's safetensors metadata.
header_field() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
print(json.loads(header["__metadata__"]["config"]).get(sys.argv[2], ""))
PY
}

variants=("rms:--norm rms" "swiglu:--mlp swiglu" "rope:--positions rope"
          "all:--norm rms --mlp swiglu --positions rope")
for v in "${variants[@]}"; do
  name=${v%%:*}
  read -r -a flags <<< "${v#*:}"
  echo "== $name: train, save, resume, generate"
  "$bin" train "${small[@]}" "${flags[@]}" --steps 40 --eval-every 20 --save "$tmp/$name.safetensors" \
    --json "$tmp/$name.json" > /dev/null || fail "$name: train exited $?"
  python3 - "$tmp/$name.json" <<'PY' || fail "$name: the validation loss did not fall"
import json, sys
losses = [e["val_loss"] for e in json.load(open(sys.argv[1]))["epochs"]]
assert len(losses) == 2 and losses[-1] < losses[0], losses
print("validation loss", [round(l, 4) for l in losses])
PY
  for i in $(seq 0 2 $((${#flags[@]} - 1))); do
    key=${flags[$i]#--}
    [ "$(header_field "$tmp/$name.safetensors" "$key")" = "${flags[$((i + 1))]}" ] \
      || fail "$name: the checkpoint does not record $key=${flags[$((i + 1))]}"
  done
  "$bin" train "${small[@]}" "${flags[@]}" --steps 20 --eval-every 20 --save "$tmp/$name.half.safetensors" \
    > /dev/null || fail "$name: the first half exited $?"
  "$bin" train "${small[@]}" "${flags[@]}" --steps 40 --eval-every 20 --resume "$tmp/$name.half.safetensors" \
    --json "$tmp/$name.resumed.json" > /dev/null || fail "$name: resume exited $?"
  python3 - "$tmp/$name.json" "$tmp/$name.resumed.json" <<'PY' || fail "$name: the resumed run differs"
import json, sys
full, resumed = (json.load(open(p)) for p in sys.argv[1:])
assert full["step_loss"] == resumed["step_loss"], "the resumed steps differ"
assert full["epochs"][-1]["val_loss"] == resumed["epochs"][-1]["val_loss"], (full["epochs"], resumed["epochs"])
PY
  gen() { "$bin" generate --checkpoint "$tmp/$name.safetensors" --prompt "The whale" --tokens 40 --seed 5 "$@"; }
  gen > "$tmp/$name.gen" || fail "$name: generate exited $?"
  gen > "$tmp/$name.gen2"
  cmp -s "$tmp/$name.gen" "$tmp/$name.gen2" || fail "$name: one seed gave two texts"
  grep -q "^The whale" "$tmp/$name.gen" || fail "$name: the text does not start with the prompt"
done

echo "== one-line errors, exit status 2"
for bad in "--norm batch" "--mlp relu" "--positions sinusoidal"; do
  read -r -a flags <<< "$bad"
  "$bin" train "${small[@]}" "${flags[@]}" --steps 1 > /dev/null 2> "$tmp/err"; rc=$?
  [ "$rc" = 2 ] || fail "$bad: exit $rc, expected 2"
  grep -q -- "${flags[0]} must be" "$tmp/err" || fail "$bad: message: $(cat "$tmp/err")"
done
"$bin" train --model mlp --data "text:$tmp/moby.txt" --norm rms --steps 1 > /dev/null 2> "$tmp/err"; rc=$?
[ "$rc" = 2 ] && grep -q -- "--norm applies to --model transformer only" "$tmp/err" \
  || fail "--norm on mlp: exit $rc, $(cat "$tmp/err")"
exit "$fails"
