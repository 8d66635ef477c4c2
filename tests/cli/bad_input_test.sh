#!/usr/bin/env bash
# Bad input to `mixtrain train` gives a one-line error naming the file or flag, exit status 2, no crash,
# and never leaves a partial --json file.
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect_error "<substring of the message>" args...
expect_error() {
  local want="$1"; shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ]; then
    echo "FAIL: mixtrain $* exited $rc, expected 2"; cat "$tmp/err"; fails=$((fails+1)); return
  fi
  if ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL: mixtrain $*: stderr lacks '$want':"; cat "$tmp/err"; fails=$((fails+1)); return
  fi
  if [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
    echo "FAIL: mixtrain $*: error is not one line:"; cat "$tmp/err"; fails=$((fails+1)); return
  fi
  echo "ok: $* -> $(cat "$tmp/err")"
}

printf 'a,b,label\n1,2,0\n3,x,1\n' >"$tmp/nonnumeric.csv"
printf 'a,b,label\n1,2,0\n3,4\n' >"$tmp/ragged.csv"
printf '\x00\x00\x08\x03\x00\x00\x00\x02' >"$tmp/truncated-images-idx3-ubyte"
printf '\x00\x00\x08\x07\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00' >"$tmp/badmagic-images-idx3-ubyte"
# 3 images of 1x1 but labels for 2.
printf '\x00\x00\x08\x03\x00\x00\x00\x03\x00\x00\x00\x01\x00\x00\x00\x01\x01\x02\x03' >"$tmp/train-images-idx3-ubyte"
printf '\x00\x00\x08\x01\x00\x00\x00\x02\x00\x01' >"$tmp/train-labels-idx1-ubyte"
# Dimensions whose product overflows.
printf '\x00\x00\x08\x03\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff' >"$tmp/huge-images-idx3-ubyte"

expect_error "missing.csv" train --data "$tmp/missing.csv" --epochs 1
# --device: a malformed name, and a GPU this machine cannot use (none, or no such index), refused before the data.
expect_error "--device: unknown device 'gpu' (valid devices are cpu, cuda and cuda:N)" train --device gpu --epochs 1
expect_error "compare --device cuda:99: this machine cannot use it" compare --device cuda:99 --data "$tmp/missing.csv"
expect_error "train --device cuda:99: this machine cannot use it" train --device cuda:99 --data "$tmp/missing.csv"
expect_error "inspect --device cuda:99: this machine cannot use it" inspect --device cuda:99 --data "$tmp/missing.csv"
expect_error "generate --device cuda:99: this machine cannot use it" generate --device cuda:99 --checkpoint "$tmp/none"
expect_error "bench step --device cuda:99: this machine cannot use it" bench step --device cuda:99
# Output paths are checked before any data is read or trained on.
expect_error "does not exist or is not writable" train --data "$tmp/missing.csv" --epochs 1 --json "$tmp/no/such/dir/r.json"
expect_error "does not exist or is not writable" train --data "$tmp/missing.csv" --epochs 1 --save "$tmp/no/dir/ck.safetensors"
expect_error "is a directory" train --data "$tmp/missing.csv" --epochs 1 --json "$tmp"
expect_error "nonnumeric.csv" train --data "$tmp/nonnumeric.csv" --epochs 1
expect_error "ragged.csv" train --data "$tmp/ragged.csv" --epochs 1
expect_error "truncated-images-idx3-ubyte" train --data "$tmp/truncated-images-idx3-ubyte" --epochs 1
expect_error "badmagic-images-idx3-ubyte" train --data "$tmp/badmagic-images-idx3-ubyte" --epochs 1
expect_error "train-labels-idx1-ubyte" train --data "$tmp/train-images-idx3-ubyte" --epochs 1
expect_error "huge-images-idx3-ubyte" train --data "$tmp/huge-images-idx3-ubyte" --epochs 1
expect_error "unknown model 'vgg'; valid models: cnn, mlp, resnet" train --model vgg
expect_error "unknown optimizer" train --optimizer adagrad
expect_error "mixed_float16" train --policy mixed_float4
expect_error "--epochs must be a positive integer" train --epochs 0
expect_error "--epochs expects an integer" train --epochs five
# Numbers past int (or past int64) are refused with the flag and its range, never truncated: 2^32 + 1 once trained
# 1 epoch and exited 0.
expect_error "--epochs must be a positive integer no larger than 2147483647, got 4294967297" train --epochs 4294967297
expect_error "--epochs must be a positive integer no larger than 2147483647, got 99999999999" train --epochs 99999999999
expect_error "--epochs must be a positive integer no larger than 2147483647" train --epochs 99999999999999999999999
expect_error "--batch-size must be a positive integer no larger than 2147483647" train --batch-size 4294967296
expect_error "--seed must be a non-negative integer no larger than 9223372036854775807" train --seed 9223372036854775808
expect_error "--hidden items must be integers from 1 to 2147483647, got '4611686018427387904'" train --hidden 16,4611686018427387904
expect_error "--steps must be a positive integer no larger than 2147483647" bench step --steps 4294967297
expect_error "--batch-size must be a positive integer" train --batch-size -3
# --save-every counts steps: the whole int64 range, checked before any data is read; it needs --save.
expect_error "--save-every must be a positive integer no larger than 9223372036854775807, got 0" train --save-every 0 --save "$tmp/ck-every.safetensors"
expect_error "--save-every must be a positive integer no larger than 9223372036854775807, got 9223372036854775808" train --save-every 9223372036854775808 --save "$tmp/ck-every.safetensors"
# --accumulate: micro-batches per batch, 1 to --batch-size.
expect_error "--accumulate must be a positive integer no larger than 2147483647, got 0" train --accumulate 0
expect_error "--accumulate must be in [1, --batch-size 16] (micro-batches per batch), got 17" train --batch-size 16 --accumulate 17
expect_error "--save-every must be a positive integer no larger than 9223372036854775807, got -2" train --save-every -2 --save "$tmp/ck-every.safetensors"
expect_error "--save-every expects an integer, got '1.5'" train --save-every 1.5 --save "$tmp/ck-every.safetensors"
expect_error "--save-every 5 needs --save PATH" train --save-every 5
expect_error "unknown flag '--epoch'" train --epoch 3
# An empty path was taken as no path (a run with an unset variable trained and saved nothing); a repeated flag
# silently took its last value.
expect_error "--save needs a path, got an empty value" train --save '' --epochs 1
expect_error "--resume needs a path, got an empty value" train --resume= --epochs 1
expect_error "--json needs a path, got an empty value" train --json '' --epochs 1
expect_error "--json needs a path, got an empty value" inspect --json ''
expect_error "--json needs a path, got an empty value" doctor --json=
expect_error "--out needs a path, got an empty value" compare --out '' --epochs 1
expect_error "--checkpoint needs a path, got an empty value" generate --checkpoint ''
expect_error "flag '--epochs' is given twice ('3' and '5')" train --epochs 3 --epochs 5
expect_error "flag '--save' is given twice" train --save "$tmp/a.st" --save="$tmp/b.st"
expect_error "--loss-scale" train --loss-scale lots
expect_error "unknown normalization" train --data "$tmp/ragged.csv" --normalize zscore
expect_error "unknown command" fly

# Damaged checkpoints given to --resume: a flipped data byte, a truncated file, a header length past the end of the
# file. Each is refused (exit 2) naming the file, never loaded.
printf 'a,b,label\n' >"$tmp/small.csv"
for i in $(seq 0 59); do printf '%d,%d,%d\n' $((i % 7)) $((i % 5)) $((i % 2)) >>"$tmp/small.csv"; done
small=(--data "$tmp/small.csv" --batch-size 8 --hidden 8 --seed 1)
if ! "$bin" train "${small[@]}" --epochs 1 --save "$tmp/ck.safetensors" >/dev/null 2>"$tmp/err"; then
  echo "FAIL: could not save a checkpoint to damage:"; cat "$tmp/err"; fails=$((fails+1))
fi
python3 - "$tmp/ck.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
flipped = bytearray(b); flipped[-3] ^= 0x10  # a byte of the last tensor's data
open(p.replace("ck.", "ck-flipped."), "wb").write(flipped)
open(p.replace("ck.", "ck-truncated."), "wb").write(b[:-5])
past = bytearray(b); past[:8] = struct.pack("<Q", len(b))  # a header as long as the whole file
open(p.replace("ck.", "ck-past."), "wb").write(past)
PY
expect_error "ck-flipped.safetensors': tensor 'rng/dropout' fails its checksum" train "${small[@]}" --epochs 2 --resume "$tmp/ck-flipped.safetensors"
expect_error "ck-truncated.safetensors': tensor 'rng/dropout': data_offsets" train "${small[@]}" --epochs 2 --resume "$tmp/ck-truncated.safetensors"
expect_error "ck-past.safetensors': header length" train "${small[@]}" --epochs 2 --resume "$tmp/ck-past.safetensors"
# Data paths that are not regular files are refused before they are opened (a FIFO once blocked forever and
# /dev/zero behind a .csv name was read until memory ran out).
mkfifo "$tmp/fifo.csv"
ln -s /dev/zero "$tmp/zero.csv"
expect_error "CSV file '$tmp/fifo.csv' is a FIFO (named pipe), not a regular file" train --data "$tmp/fifo.csv" --epochs 1
expect_error "CSV file '$tmp/zero.csv' is a character device, not a regular file" train --data "$tmp/zero.csv" --epochs 1

# A failed run leaves no --json file behind, and an existing one untouched.
echo '{"previous": true}' >"$tmp/keep.json"
"$bin" train --data "$tmp/nonnumeric.csv" --json "$tmp/keep.json" >/dev/null 2>&1
if [ "$(cat "$tmp/keep.json")" != '{"previous": true}' ]; then echo "FAIL: --json file was touched"; fails=$((fails+1)); fi
if ls "$tmp"/keep.json.tmp.* >/dev/null 2>&1; then echo "FAIL: temporary file left behind"; fails=$((fails+1)); fi

# Asking a command for help is not bad input: the usage on stdout, exit 0, wherever a flag may stand; as a flag's
# value it is that value, and an unknown command or a flag before it is still refused.
for cmd in train compare inspect generate doctor bench "bench step" "bench gemm" "train --epochs 3"; do
  # shellcheck disable=SC2086
  "$bin" $cmd --help >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "^usage: mixtrain <command>" "$tmp/out" || [ -s "$tmp/err" ]; then
    echo "FAIL: mixtrain $cmd --help exited $rc or printed no usage"; cat "$tmp/err"; fails=$((fails+1))
  fi
done
"$bin" train -h | grep -q "^usage: mixtrain <command>" || { echo "FAIL: train -h printed no usage"; fails=$((fails+1)); }
"$bin" bench step -h | grep -q "^usage: mixtrain <command>" || { echo "FAIL: bench step -h printed no usage"; fails=$((fails+1)); }
expect_error "unknown flag '--bogus'" train --bogus 1 --help
expect_error "unknown command 'bogus'" bogus --help
expect_error "generate needs --checkpoint FILE" generate --prompt --help
# --tokenizer: refused before any data is read (the cases that train or load a model are in tokenizer_test.sh).
printf 'a tiny text\n' >"$tmp/tiny.txt"
text_model=(--model transformer --data "text:$tmp/tiny.txt" --steps 1)
expect_error "--tokenizer must be char, bpe:N, unigram:N or a FILE.model, got 'words'" train "${text_model[@]}" \
  --tokenizer words
expect_error "--tokenizer bpe:lots: 'lots' is not a whole number of pieces" train "${text_model[@]}" --tokenizer bpe:lots
expect_error "--tokenizer unigram:1: the number of pieces must be in [2, 1000000], got 1" compare "${text_model[@]}" \
  --tokenizer unigram:1
expect_error "--tokenizer applies to text (--data moby-dick or text:PATH), not to --data fashion-mnist" train \
  --tokenizer bpe:300 --epochs 1
expect_error "--tokenizer applies to text" inspect --data "$tmp/missing.csv" --tokenizer char
# --data text: a directory without files, and an empty name in a list of files.
mkdir "$tmp/no-text"
expect_error "the directory '$tmp/no-text' holds no text files" train --model transformer --data "text:$tmp/no-text" \
  --steps 1
expect_error "has an empty path" train --model transformer --data "text:$tmp/tiny.txt," --steps 1

# Errors quote input escaped and capped: an escape sequence in a cell reaches the terminal as text, a 2 MB cell
# does not become a 2 MB line (issue 40, finding 5).
printf 'a,b,label\n1,\033[31mRED\033[0m,0\n' >"$tmp/escape.csv"
expect_error "'\\x1B[31mRED\\x1B[0m' is not a number" train --data "$tmp/escape.csv" --epochs 1
if grep -q $'\033' "$tmp/err"; then echo "FAIL: an escape byte reached stderr"; fails=$((fails+1)); fi
{ printf 'a,b,label\n1,'; head -c 2000000 /dev/zero | tr '\0' x; printf ',0\n'; } >"$tmp/hugecell.csv"
expect_error "xxxx... (2000000 bytes)' is not a number" train --data "$tmp/hugecell.csv" --epochs 1
if [ "$(wc -c <"$tmp/err")" -gt 1000 ]; then echo "FAIL: a 2 MB cell made a $(wc -c <"$tmp/err")-byte line"; fails=$((fails+1)); fi
# bench gemm has no --batch-size: sizes that cannot fit are refused naming --sizes before anything is allocated.
expect_error "bench gemm --sizes 1000000: its matrices need 18.2 TiB" bench gemm --sizes 1000000

# generate on a checkpoint of the library's save_checkpoint (an empty configuration: it said "invalid JSON ... line
# 1, column 1"), and on one whose configuration is invalid (it blamed --width, a flag never passed, and no file).
python3 - "$tmp" <<'PY'
import json, struct, sys
def write(name, meta):
    h = json.dumps({"__metadata__": meta}).encode()
    open(f"{sys.argv[1]}/{name}", "wb").write(struct.pack("<Q", len(h)) + h)
write("lib.safetensors", {"config": ""})
write("badcfg.safetensors", {"config": json.dumps({"model": "transformer", "width": -5, "vocabulary": [97, 98]})})
PY
expect_error "lib.safetensors' has no run configuration (not saved by train --save)" generate --checkpoint "$tmp/lib.safetensors" --prompt a
expect_error "badcfg.safetensors' (config): the saved run configuration is not valid: --width must be" generate --checkpoint "$tmp/badcfg.safetensors" --prompt a

# Images of 3x3 (9 features) are too small for the cnn's and resnet's two poolings: said so, not an internal Dense
# error about a (0,) sample.
for i in 0 1 2 3 4 5; do echo "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,$((i % 2))"; done >"$tmp/img3x3.csv"
expect_error "the cnn model halves its images twice (two 2x2 poolings), so they need at least 4x4 pixels; this data's are 3x3" train --data "$tmp/img3x3.csv" --model cnn --epochs 1
expect_error "the resnet model halves its images twice" train --data "$tmp/img3x3.csv" --model resnet --epochs 1
# Under mixed_float16 on a CPU without fast float16 the precision check's warning (4 lines) came before every error
# raised once the model was being built; it is held and printed after a command that ran, so the error stays one
# line (on a CPU with AVX512-FP16 or AMX-FP16 there is no warning and this passes either way).
expect_error "the cnn model halves its images twice" train --data "$tmp/img3x3.csv" --model cnn --epochs 1 --policy mixed_float16

# --optimizer-state: its values, Adam's alone, and a checkpoint of float32 moments resumed with bfloat16 ones
# (refused, not converted: a resume gives the saved run's bits).
expect_error "--optimizer-state must be float32 or bfloat16, got 'float16'" train --optimizer-state float16 --epochs 1
expect_error "--optimizer-state bfloat16 keeps Adam's moments; it needs --optimizer adam or adamw, got sgd" train \
  --optimizer-state bfloat16 --optimizer sgd --epochs 1
expect_error "--master-rounding stochastic rounds bfloat16 master weights or optimizer state" train \
  --master-rounding stochastic --policy mixed_bfloat16 --epochs 1
# kahan: bfloat16 master weights only; compare's per-run settings are checked like the shared flags.
expect_error "--master-rounding must be nearest, stochastic or kahan, got 'up'" train --master-rounding up --epochs 1
expect_error "--master-rounding kahan compensates bfloat16 master weights; --policy mixed_bfloat16" train \
  --master-rounding kahan --policy mixed_bfloat16 --epochs 1
expect_error "--policies entry 'bfloat16:lr=1': unknown setting 'lr'" compare --policies float32,bfloat16:lr=1 --epochs 1
expect_error "--policies entry 'bfloat16:kahan': expected KEY=VALUE" compare --policies float32,bfloat16:kahan --epochs 1
expect_error "--master-rounding kahan compensates bfloat16 master weights; --policy float32" compare \
  --policies float32:master-rounding=kahan,bfloat16 --epochs 1
for i in $(seq 0 39); do echo "0.$((i % 10)),0.$((9 - i % 10)),$((i % 2))"; done >"$tmp/state.csv"
if "$bin" train --data "$tmp/state.csv" --epochs 1 --batch-size 4 --save "$tmp/f32state.safetensors" >/dev/null 2>&1; then
  expect_error "optimizer state is float32" train --data "$tmp/state.csv" --epochs 2 --batch-size 4 \
    --optimizer-state bfloat16 --resume "$tmp/f32state.safetensors"
else
  echo "FAIL: training on $tmp/state.csv failed"; fails=$((fails+1))
fi

# A checkpoint of bfloat16 weights saved without Kahan compensation, resumed with it (and the reverse): refused.
if "$bin" train --data "$tmp/state.csv" --epochs 1 --batch-size 4 --policy bfloat16 \
    --save "$tmp/nearest.safetensors" >/dev/null 2>&1 &&
  "$bin" train --data "$tmp/state.csv" --epochs 1 --batch-size 4 --policy bfloat16 --master-rounding kahan \
    --save "$tmp/kahan.safetensors" >/dev/null 2>&1; then
  expect_error "has no Kahan compensation" train --data "$tmp/state.csv" --epochs 2 --batch-size 4 --policy bfloat16 \
    --master-rounding kahan --resume "$tmp/nearest.safetensors"
  expect_error "holds Kahan compensation" train --data "$tmp/state.csv" --epochs 2 --batch-size 4 --policy bfloat16 \
    --resume "$tmp/kahan.safetensors"
else
  echo "FAIL: training bfloat16 weights on $tmp/state.csv failed"; fails=$((fails+1))
fi

# --remat: its values, and the models whose blocks it recomputes.
expect_error "--remat must be blocks, activations or none, got 'full'" train --model transformer --remat full --epochs 1
expect_error "--remat applies to --model transformer and resnet only, got --model cnn" train --model cnn \
  --remat blocks --epochs 1
expect_error "--remat must be blocks, activations or none, got 'yes'" bench step --model resnet --remat yes
expect_error "--remat blocks does not work with --sync-batch-norm yet" train --model resnet --remat blocks \
  --sync-batch-norm --epochs 1

[ $fails -eq 0 ] && echo "all bad-input cases passed"
exit $fails
