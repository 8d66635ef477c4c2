#!/usr/bin/env bash
# Running out of memory: a model too wide for the memory allowed (ulimit -v) ends with status 1 and one line
# that says what to try; at --batch-size 1 it does not suggest a smaller batch (the model itself does not fit).
# A model too big for the machine's memory is refused by the run's memory limit (exit status 2).
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
start_checks

python3 - "$tmp/four.csv" <<'PY'
import random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    f.write("a,b,c,d,label\n")
    for i in range(200):
        f.write(",".join(f"{random.random():.3f}" for _ in range(4)) + f",{i % 2}\n")
PY

# 30 million hidden units: 3.1 GiB of weights, gradients and Adam slots, under the run's memory limit (80% of the
# memory available) but more than the 1 GiB of address space the run is given.
run() { (ulimit -v 1048576; OMP_NUM_THREADS=1 "$bin" train --data "$tmp/four.csv" --hidden 30000000 --epochs 1 "$@") \
          > "$tmp/out" 2> "$tmp/err"; }

# AddressSanitizer reserves terabytes of address space for its shadow memory when the process starts, so under
# ulimit -v an instrumented binary cannot start at all: these two checks need an uninstrumented one.
asan=0
ldd "$bin" 2>/dev/null | grep -q libasan && asan=1
if [ "$asan" = 1 ]; then
  echo "out_of_memory: the ulimit -v checks skipped: this binary runs under AddressSanitizer"
else
  run --batch-size 1
  code=$?
  [ "$code" = 1 ] || fail "batch 1: exit status $code, expected 1 ($(cat "$tmp/err"))"
  grep -q "out of memory (even at --batch-size 1" "$tmp/err" || fail "batch 1: message was: $(cat "$tmp/err")"
  grep -q "smaller --batch-size" "$tmp/err" && fail "batch 1: suggests a smaller batch: $(cat "$tmp/err")"
  [ "$(wc -l < "$tmp/err")" -le 2 ] || fail "batch 1: more than one error line: $(cat "$tmp/err")"

  run --batch-size 32
  code=$?
  [ "$code" = 1 ] || fail "batch 32: exit status $code, expected 1 ($(cat "$tmp/err"))"
  grep -q "out of memory (try a smaller --batch-size" "$tmp/err" || fail "batch 32: message was: $(cat "$tmp/err")"
fi

# Without an address-space limit: the run's tensors may hold 80% of the memory available, and a model whose size
# estimate passes it is refused before any weight is allocated, with exit status 2, one line, and what would fit.
# 100 million units on 4 features: 10.4 GiB of weights and state, 763 MiB of activations per sample.
start=$(date +%s)
OMP_NUM_THREADS=1 "$bin" train --data "$tmp/four.csv" --hidden 100000000 --epochs 1 > "$tmp/out" 2> "$tmp/err"
code=$?
took=$(( $(date +%s) - start ))
[ "$code" = 2 ] || fail "10^8 units: exit status $code, expected 2 ($(cat "$tmp/err"))"
grep -q "model 'mlp' does not fit in memory: its 700000002 weights need at least 10.4 GiB" "$tmp/err" ||
  fail "10^8 units: message was: $(cat "$tmp/err")"
grep -q "use --batch-size [0-9]* or less" "$tmp/err" || fail "10^8 units: no batch that fits: $(cat "$tmp/err")"
# At once: within 5 s, or 30 s under AddressSanitizer, whose start-up and instrumented CSV reading on a loaded
# machine took 6 s once.
[ "$took" -le $(( asan ? 30 : 5 )) ] || fail "10^8 units: refused after $took s, expected at once"
[ "$(wc -l < "$tmp/err")" = 1 ] || fail "10^8 units: not one line: $(cat "$tmp/err")"

# A layer of 2^31-1 units (a 32 GiB kernel on 4 features): the weights alone pass the limit.
OMP_NUM_THREADS=1 "$bin" train --data "$tmp/four.csv" --hidden 2147483647 --epochs 1 > "$tmp/out" 2> "$tmp/err"
code=$?
[ "$code" = 2 ] || fail "2^31-1 units: exit status $code, expected 2 ($(cat "$tmp/err"))"
grep -q "does not fit in memory: its 15032385531 weights need at least 224.0 GiB" "$tmp/err" ||
  fail "2^31-1 units: message was: $(cat "$tmp/err")"
grep -q "weights fit: use fewer or narrower layers" "$tmp/err" || fail "2^31-1 units: no hint: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/err")" = 1 ] || fail "2^31-1 units: not one line: $(cat "$tmp/err")"

# The same refusal for the other models that estimate their size: a cnn with a dense layer of 2^31-1 units and a
# transformer of width 65536 and 64 blocks.
OMP_NUM_THREADS=1 "$bin" train --model cnn --data "$tmp/four.csv" --hidden 2147483647 --epochs 1 > "$tmp/out" 2> "$tmp/err"
code=$?
[ "$code" = 2 ] || fail "cnn: exit status $code, expected 2 ($(cat "$tmp/err"))"
grep -q "model 'cnn' does not fit in memory" "$tmp/err" || fail "cnn: message was: $(cat "$tmp/err")"
python3 -c "print('the quick brown fox jumps over the lazy dog. ' * 200)" > "$tmp/text.txt"
OMP_NUM_THREADS=1 "$bin" train --model transformer --data "text:$tmp/text.txt" --width 65536 --layers 64 --heads 1 \
  --steps 2 > "$tmp/out" 2> "$tmp/err"
code=$?
[ "$code" = 2 ] || fail "transformer: exit status $code, expected 2 ($(cat "$tmp/err"))"
grep -q "model 'transformer' does not fit in memory: its 3298540978176 weights" "$tmp/err" ||
  fail "transformer: message was: $(cat "$tmp/err")"

[ "$fails" = 0 ] && echo "out_of_memory: all checks passed"
exit "$fails"
