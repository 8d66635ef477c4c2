#!/usr/bin/env bash
# Subword tokenizers end to end (built with SentencePiece): a small transformer trained a few steps with
# --tokenizer bpe:N and unigram:N on the first 100,000 characters of Moby Dick, then `generate` from the checkpoint
# alone (the text gone) writing valid UTF-8, also for a prompt whose characters the text never used; the same
# tokenizer from two trainings and from the .model file it came from; `compare` at context 256 with a subword
# model's default batch and steps; text from a directory and from a list of files; one-line errors with exit status 2.
set -u
bin="$1"
. "$(dirname "$0")/lib.sh"
require_moby_dick
start_checks
mkdir "$tmp/data"
python3 - "$(moby_dick_path)" "$tmp/data/moby.txt" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(text[:100000])
PY
small=(--model transformer --data "text:$tmp/data/moby.txt" --context 32 --width 32 --layers 1 --heads 2
       --batch-size 16 --seed 3)

# header_field FILE KEY: a field of the run configuration in a checkpoint's safetensors metadata.
header_field() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
print(json.loads(header["__metadata__"]["config"]).get(sys.argv[2], ""))
PY
}

echo "== train with bpe:400 and unigram:400, save"
for t in bpe:400 unigram:400; do
  name=${t%%:*}
  "$bin" train "${small[@]}" --tokenizer "$t" --steps 30 --eval-every 15 --save "$tmp/$name.safetensors" \
    --json "$tmp/$name.json" > "$tmp/$name.out" || fail "train --tokenizer $t exited $?"
  grep -F "tokenizer: $t, 400 subword pieces" "$tmp/$name.out" || fail "no tokenizer line for $t"
  grep -F "vocabulary of 400 tokens" "$tmp/$name.out" || fail "the data line does not count 400 tokens for $t"
  python3 - "$tmp/$name.json" "$t" <<'PY' || fail "$t: the validation loss did not fall"
import json, math, sys
run = json.load(open(sys.argv[1]))
assert run["tokenizer"] == sys.argv[2], run.get("tokenizer")
losses = [e["val_loss"] for e in run["epochs"]]
assert losses[-1] < losses[0] < math.log(400) + 0.5, losses  # from about ln(400) at the start
PY
done

echo "== generate from the checkpoint alone: the text is gone"
rm -r "$tmp/data"
for name in bpe unigram; do
  for prompt in "The whale" "鯨 — Ahab"; do  # the second's first characters are not in the text: byte pieces
    "$bin" generate --checkpoint "$tmp/$name.safetensors" --prompt "$prompt" --tokens 60 --seed 5 > "$tmp/gen" \
      || fail "generate from $name exited $?"
    "$bin" generate --checkpoint "$tmp/$name.safetensors" --prompt "$prompt" --tokens 60 --seed 5 > "$tmp/gen2"
    cmp -s "$tmp/gen" "$tmp/gen2" || fail "generate from $name: one seed gave two texts"
    python3 - "$tmp/gen" "$prompt" <<'PY' || fail "generate from $name: bad text"
import sys
text = open(sys.argv[1], "rb").read().decode("utf-8")  # strict: the stream is valid UTF-8
assert text.startswith(sys.argv[2]), text
assert len(text) > len(sys.argv[2]) + 20, text  # 60 pieces of one or more bytes each
PY
    head -c 200 "$tmp/gen"; echo
  done
done

echo "== the same text and N train the same tokenizer; its .model file gives it back"
python3 - "$(moby_dick_path)" "$tmp/moby.txt" <<'PY'
import sys
open(sys.argv[2], "w", encoding="utf-8").write(open(sys.argv[1], encoding="utf-8").read()[:100000])
PY
small[3]="text:$tmp/moby.txt"
"$bin" train "${small[@]}" --tokenizer bpe:400 --steps 2 --save "$tmp/again.safetensors" > /dev/null
first=$(header_field "$tmp/bpe.safetensors" tokenizer_model)
[ -n "$first" ] && [ "$first" = "$(header_field "$tmp/again.safetensors" tokenizer_model)" ] ||
  fail "two trainings of bpe:400 stored different tokenizers"
echo "$first" | base64 -d > "$tmp/bpe400.model"
"$bin" train "${small[@]}" --tokenizer "$tmp/bpe400.model" --steps 2 --save "$tmp/file.safetensors" \
  > "$tmp/file.out" || fail "train --tokenizer FILE.model exited $?"
grep -F "vocabulary of 400 tokens" "$tmp/file.out" || fail "the .model file's tokenizer does not have 400 pieces"
[ "$first" = "$(header_field "$tmp/file.safetensors" tokenizer_model)" ] ||
  fail "the checkpoint does not store the .model file's tokenizer"
"$bin" train "${small[@]}" --steps 2 --save "$tmp/char.safetensors" > /dev/null
[ -z "$(header_field "$tmp/char.safetensors" tokenizer_model)" ] || fail "a character model stored a subword model"

echo "== compare with bpe:N at context 256: the subword defaults, three policies, finite losses"
# The main job's --tokenizer bpe:2048 --context 256 variant, small: without --batch-size and --steps a subword model
# takes 32 x 64 / 256 = 8 windows a step and two passes over its training tokens (ceil(windows / 16) steps). A third
# of the text keeps it to about a dozen steps a policy.
head -c 30000 "$tmp/moby.txt" > "$tmp/moby30k.txt"
"$bin" compare --model transformer --data "text:$tmp/moby30k.txt" --tokenizer bpe:400 --context 256 --width 32 \
  --layers 1 --heads 2 --seed 3 --baseline-seeds 1 --policies float32,mixed_float16,mixed_bfloat16 \
  --out "$tmp/cmp" > "$tmp/cmp.out" || fail "compare --tokenizer bpe:400 --context 256 exited $?"
grep -E "^(data|steps|validation):" "$tmp/cmp.out"
python3 - "$tmp/cmp/report.json" "$tmp/cmp.out" <<'PY' || fail "compare --tokenizer bpe:400 --context 256: bad report"
import json, math, re, sys
rep = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
windows = int(re.search(r"— (\d+) training and \d+ validation windows of 256 tokens", out).group(1))
steps = -(-windows // 16)
assert f"steps: {steps}, two passes over the training tokens in batches of 8 windows" in out, out
assert out.count("nats per token") == 3 and "nats per character" not in out, out
runs = rep["policies"]
assert sorted(runs) == ["float32", "mixed_bfloat16", "mixed_float16"], sorted(runs)
for p, r in runs.items():
    assert r["tokenizer"] == "bpe:400" and r["batch_size"] == 8 and r["steps"] == steps, (p, r["batch_size"], r["steps"])
    losses = r["step_loss"] + [e["val_loss"] for e in r["epochs"]] + [r["test"]["loss"]]
    assert len(r["step_loss"]) == steps and all(math.isfinite(v) for v in losses), (p, losses)
    assert r["test"]["loss"] < math.log(400), (p, r["test"]["loss"])  # below a uniform guess over the pieces
    assert r["verdict"] in ("baseline", "tracks", "no speedup", "deviates"), (p, r["verdict"])
PY

echo "== --data text:DIR and text:A,B: the files joined in order"
mkdir "$tmp/parts"
python3 - "$tmp/moby.txt" "$tmp/parts" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
for i in range(3):  # part0 .. part2, each ending inside a line: the joins add a newline
    open(f"{sys.argv[2]}/part{i}.txt", "w", encoding="utf-8").write(text[i * 33000:(i + 1) * 33000].rstrip("\n"))
PY
for spec in "$tmp/parts" "$tmp/parts/part0.txt,$tmp/parts/part1.txt,$tmp/parts/part2.txt"; do
  small[3]="text:$spec"
  "$bin" train "${small[@]}" --tokenizer bpe:400 --steps 2 --save "$tmp/parts.safetensors" > "$tmp/parts.out" ||
    fail "train --data text:$spec exited $?"
  grep -F "vocabulary of 400 tokens" "$tmp/parts.out" || fail "--data text:$spec: no 400-token vocabulary"
  "$bin" generate --checkpoint "$tmp/parts.safetensors" --tokens 10 > /dev/null || fail "generate after text:$spec"
done
small[3]="text:$tmp/moby.txt"

echo "== bad values: one line, exit status 2"
echo "not a model" > "$tmp/junk.model"
for case in "bpe:100|100 pieces are too few for" "unigram:900000|is too short to make 900000 pieces" \
            "$tmp/junk.model|is not a SentencePiece model" "$tmp/none.model|does not exist"; do
  t=${case%%|*}
  want=${case#*|}
  "$bin" train "${small[@]}" --tokenizer "$t" --steps 2 > /dev/null 2> "$tmp/err"
  rc=$?
  [ $rc -eq 2 ] || fail "--tokenizer $t exited $rc, expected 2"
  grep -qF -- "$want" "$tmp/err" || fail "--tokenizer $t: stderr lacks '$want': $(cat "$tmp/err")"
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "--tokenizer $t: the error is not one line"
  echo "ok: --tokenizer $t -> $(cat "$tmp/err")"
done

[ "$fails" -eq 0 ] && echo "all tokenizer checks passed"
exit "$fails"
