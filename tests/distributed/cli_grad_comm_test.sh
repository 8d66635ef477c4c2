#!/usr/bin/env bash
# `mpirun -np 2 mixtrain train --grad-comm bfloat16` (gradients exchanged in bfloat16, summed in float32): the run
# says so and ends near the float32 exchange's weights but not on them; a run resumed on the same two ranks under
# mixed_float16 (its loss scale in the checkpoint) ends bit-identical to the uninterrupted one; with --zero 1 and
# --accumulate 2 it trains; on one process it is a no-op that says so; a bad value exits 2 with one line. A few
# seconds: the model is small (grad_comm_test.cpp holds the exchange to bfloat16's rounding bound).
# Usage: cli_grad_comm_test.sh MIXTRAIN MPIEXEC
set -eu
. "$(dirname "$0")/two_ranks_lib.sh"
write_blobs_csv "$tmp/data.csv" 320
flags=(train --data "$tmp/data.csv" --batch-size 32 --seed 3 --lr 0.003 --hidden 33,17 --lr-schedule constant
       --warmup-steps 0)

# The largest relative difference of two checkpoints' float32 tensors, and whether it is within [low, high].
cat >"$tmp/compare.py" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return {k: struct.unpack(f"<{(v['data_offsets'][1] - v['data_offsets'][0]) // 4}f",
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
worst = max(abs(x - y) / (1 + abs(y)) for k in a for x, y in zip(a[k], b[k]))
low, high = float(sys.argv[4]), float(sys.argv[5])
assert low <= worst <= high, f"{sys.argv[3]}: largest relative difference {worst:.3g} outside [{low}, {high}]"
print(f"{sys.argv[3]}: largest relative difference {worst:.3g}")
PY

"${two[@]}" "${flags[@]}" --epochs 2 --save "$tmp/f32.ckpt" >/dev/null
"${two[@]}" "${flags[@]}" --epochs 2 --grad-comm bfloat16 --save "$tmp/bf16.ckpt" >"$tmp/bf16.log"
grep -q 'gradients exchanged in bfloat16' "$tmp/bf16.log"
# Not the float32 run's bits (the exchange rounds), and near them (2.7e-4 measured after 20 Adam steps).
python3 "$tmp/compare.py" "$tmp/bf16.ckpt" "$tmp/f32.ckpt" "bfloat16 vs float32 exchange" 1e-9 2e-3

mixed=("${flags[@]}" --policy mixed_float16 --grad-comm bfloat16)
"${two[@]}" "${mixed[@]}" --epochs 2 --save "$tmp/full.ckpt" >/dev/null
"${two[@]}" "${mixed[@]}" --epochs 1 --save "$tmp/half.ckpt" >/dev/null
"${two[@]}" "${mixed[@]}" --epochs 2 --resume "$tmp/half.ckpt" --save "$tmp/resumed.ckpt" >/dev/null
python3 "$tmp/compare.py" "$tmp/resumed.ckpt" "$tmp/full.ckpt" "resumed = uninterrupted" 0 0

"${two[@]}" "${flags[@]}" --epochs 1 --grad-comm bfloat16 --zero 1 --accumulate 2 >"$tmp/zero.log"
grep -q 'ZeRO-1: optimizer state split over the ranks, gradients exchanged in bfloat16' "$tmp/zero.log"

"$bin" "${flags[@]}" --epochs 1 --grad-comm bfloat16 >"$tmp/one.log"
grep -q -- '--grad-comm bfloat16: one process, no gradients to exchange; training as without it' "$tmp/one.log"

status=0
"$bin" "${flags[@]}" --epochs 1 --grad-comm float16 >/dev/null 2>"$tmp/err" || status=$?
[ "$status" = 2 ] || { echo "--grad-comm float16: exit $status"; exit 1; }
[ "$(wc -l <"$tmp/err")" = 1 ] && grep -q -- "--grad-comm must be float32 or bfloat16" "$tmp/err" ||
  { echo "--grad-comm float16: $(cat "$tmp/err")"; exit 1; }
echo "cli_grad_comm: all checks passed"
