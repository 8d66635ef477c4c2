#!/usr/bin/env bash
# `mpirun -np 2 mixtrain train --policy mixed_float8` (the delayed recipe): the step max-reduces the ranks' amaxes,
# so both ranks hold rank 0's histories, and a run saved after 2 epochs and resumed on two ranks (each rank loading
# rank 0's histories) ends bit-identical to the uninterrupted one: test results and checkpoint tensors, the FP8
# histories and scales among them.
# The same for a small transformer, whose attention's two FP8 projections keep histories of their own: without their
# reduction each rank's attention scales follow its shard, and the resumed run (rank 1 loading rank 0's) parts.
# Usage: cli_fp8_test.sh MIXTRAIN MPIEXEC
set -eu
. "$(dirname "$0")/two_ranks_lib.sh"
write_blobs_csv "$tmp/data.csv" 600
flags=(train --data "$tmp/data.csv" --batch-size 32 --seed 3 --policy mixed_float8 --lr-schedule constant
  --warmup-steps 0)
"${two[@]}" "${flags[@]}" --epochs 3 --json "$tmp/full.json" --save "$tmp/full.ckpt" >/dev/null
"${two[@]}" "${flags[@]}" --epochs 2 --save "$tmp/half.ckpt" >/dev/null
"${two[@]}" "${flags[@]}" --epochs 3 --resume "$tmp/half.ckpt" --json "$tmp/resumed.json" \
  --save "$tmp/resumed.ckpt" >"$tmp/resumed.log"
grep -q "resumed from" "$tmp/resumed.log"
python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(7)
words = ["the", "whale", "sea", "ship", "captain", "white", "water", "deep", "night", "storm"]
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(3000)))
PY
lm=(train --model transformer --data "text:$tmp/text.txt" --context 16 --width 16 --layers 1 --heads 2
  --batch-size 8 --seed 3 --policy mixed_float8 --lr-schedule constant --warmup-steps 0 --eval-every 6)
"${two[@]}" "${lm[@]}" --steps 12 --json "$tmp/lm_full.json" --save "$tmp/lm_full.ckpt" >/dev/null
"${two[@]}" "${lm[@]}" --steps 6 --save "$tmp/lm_half.ckpt" >/dev/null
"${two[@]}" "${lm[@]}" --steps 12 --resume "$tmp/lm_half.ckpt" --json "$tmp/lm_resumed.json" \
  --save "$tmp/lm_resumed.ckpt" >"$tmp/lm_resumed.log"
grep -q "resumed from" "$tmp/lm_resumed.log"
python3 - "$tmp" <<'PY'
import json, struct, sys
d = sys.argv[1]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
full, resumed = (json.load(open(f"{d}/{n}.json")) for n in ("full", "resumed"))
assert full["test"] == resumed["test"], f"resumed {resumed['test']} vs uninterrupted {full['test']}"
a, b = tensors(f"{d}/full.ckpt"), tensors(f"{d}/resumed.ckpt")
histories = [k for k in a if k.endswith("/amax_history")]
assert histories, "the checkpoint holds no FP8 amax history"
assert a == b, "checkpoint tensors differ: " + ", ".join(k for k in a if a[k] != b.get(k))
print(f"mixed_float8 on 2 ranks resumed bit-identical: test loss {full['test']['loss']!r}, {len(histories)} histories")
full, resumed = (json.load(open(f"{d}/lm_{n}.json")) for n in ("full", "resumed"))
assert full["step_loss"] == resumed["step_loss"], "the resumed transformer's steps differ"
a, b = tensors(f"{d}/lm_full.ckpt"), tensors(f"{d}/lm_resumed.ckpt")
attention = [k for k in a if "/attention/" in k and k.endswith("/amax_history")]
assert len(attention) == 6, f"the attention's histories: {attention}"
assert a == b, "transformer checkpoint tensors differ: " + ", ".join(k for k in a if a[k] != b.get(k))
print(f"a transformer under mixed_float8 on 2 ranks resumed bit-identical: {len(attention)} attention histories")
PY
