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

# 100 million hidden units: a 1.6 GB kernel, more than the 1 GiB of address space the run is given.
run() { (ulimit -v 1048576; OMP_NUM_THREADS=1 "$bin" train --data "$tmp/four.csv" --hidden 100000000 --epochs 1 "$@") \
          > "$tmp/out" 2> "$tmp/err"; }

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

# Without an address-space limit: the run's tensors may hold 80% of the memory available, so a layer of 2^31-1
# units (a 32 GiB kernel on 4 features) is refused as it asks for the memory, with exit status 2 and one line.
OMP_NUM_THREADS=1 "$bin" train --data "$tmp/four.csv" --hidden 2147483647 --epochs 1 > "$tmp/out" 2> "$tmp/err"
code=$?
[ "$code" = 2 ] || fail "2^31-1 units: exit status $code, expected 2 ($(cat "$tmp/err"))"
grep -q "out of the memory limit: a tensor of 32.0 GiB" "$tmp/err" || fail "2^31-1 units: message was: $(cat "$tmp/err")"
grep -q "fewer or narrower layers" "$tmp/err" || fail "2^31-1 units: no hint: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/err")" = 1 ] || fail "2^31-1 units: not one line: $(cat "$tmp/err")"

[ "$fails" = 0 ] && echo "out_of_memory: all checks passed"
exit "$fails"
