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
expect_error "nonnumeric.csv" train --data "$tmp/nonnumeric.csv" --epochs 1
expect_error "ragged.csv" train --data "$tmp/ragged.csv" --epochs 1
expect_error "truncated-images-idx3-ubyte" train --data "$tmp/truncated-images-idx3-ubyte" --epochs 1
expect_error "badmagic-images-idx3-ubyte" train --data "$tmp/badmagic-images-idx3-ubyte" --epochs 1
expect_error "train-labels-idx1-ubyte" train --data "$tmp/train-images-idx3-ubyte" --epochs 1
expect_error "huge-images-idx3-ubyte" train --data "$tmp/huge-images-idx3-ubyte" --epochs 1
expect_error "unknown model 'vgg'; valid models: cnn, mlp, resnet" train --model vgg
expect_error "unknown optimizer" train --optimizer adagrad
expect_error "mixed_float16" train --policy mixed_float8
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
expect_error "unknown flag '--epoch'" train --epoch 3
expect_error "--loss-scale" train --loss-scale lots
expect_error "unknown normalization" train --data "$tmp/ragged.csv" --normalize zscore
expect_error "unknown command" fly

# A failed run leaves no --json file behind, and an existing one untouched.
echo '{"previous": true}' >"$tmp/keep.json"
"$bin" train --data "$tmp/nonnumeric.csv" --json "$tmp/keep.json" >/dev/null 2>&1
if [ "$(cat "$tmp/keep.json")" != '{"previous": true}' ]; then echo "FAIL: --json file was touched"; fails=$((fails+1)); fi
if ls "$tmp"/keep.json.tmp.* >/dev/null 2>&1; then echo "FAIL: temporary file left behind"; fails=$((fails+1)); fi

[ $fails -eq 0 ] && echo "all bad-input cases passed"
exit $fails
