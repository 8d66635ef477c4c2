#!/usr/bin/env bash
# `mpirun -np 2 mixtrain train` as a user runs it: rank 0 alone prints and writes the JSON and the checkpoint,
# the result equals one process at the same global batch, a global batch that does not divide by the ranks is
# refused (exit 2), checkpoints resume across rank counts (2 -> 1 and 1 -> 2), and a run with dropout resumed on
# two ranks ends bit-identical to the uninterrupted one.
# Usage: cli_two_ranks_test.sh MIXTRAIN MPIEXEC
set -eu
. "$(dirname "$0")/two_ranks_lib.sh"
write_blobs_csv "$tmp/data.csv" 900
flags=(train --data "$tmp/data.csv" --batch-size 32 --seed 3 --lr 0.003)

"$bin" "${flags[@]}" --epochs 3 --json "$tmp/one.json" >"$tmp/one.log"
"${two[@]}" "${flags[@]}" --epochs 3 --json "$tmp/two.json" --save "$tmp/two.ckpt" >"$tmp/two.log"
cat "$tmp/two.log"
test "$(grep -c '^test: ' "$tmp/two.log")" -eq 1 || { echo "FAIL: expected one summary (rank 0 only)"; exit 1; }
grep -q '^data-parallel: 2 ranks (mpi), global batch 32 = 2 x 16 rows per rank' "$tmp/two.log"
test -s "$tmp/two.ckpt"

python3 - "$tmp/one.json" "$tmp/two.json" <<'PY'
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
assert two["ranks"] == 2 and "ranks" not in one, (two.get("ranks"), one.get("ranks"))
assert two["communicator"] == "mpi" and "communicator" not in one, two.get("communicator")
assert len(one["step_loss"]) == len(two["step_loss"]), "the global batch must give the same number of steps"
worst = max(abs(a - b) for a, b in zip(one["step_loss"], two["step_loss"]))
assert worst < 1e-4, f"per-step loss differs from one process by {worst}"
da = abs(one["test"]["accuracy"] - two["test"]["accuracy"])
assert da <= 0.001, f"test accuracy {two['test']['accuracy']} vs one process {one['test']['accuracy']}"
assert abs(one["test"]["loss"] - two["test"]["loss"]) < 1e-4
assert two["samples_per_second"] > 0 and two["communication_bytes_per_rank"] > 0
print(f"two ranks = one process: largest step-loss difference {worst:.2e}, test accuracy {two['test']['accuracy']:.4f}")
PY

# Bit for bit where the reduction order is fixed: the same 2-rank run again, and one rank under mpirun against
# the plain process (the checkpoint tensors too; the metadata holds a time stamp).
"${two[@]}" "${flags[@]}" --epochs 3 --json "$tmp/two_again.json" --save "$tmp/two_again.ckpt" >/dev/null
"$mpiexec" -np 1 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "$bin" "${flags[@]}" --epochs 1 \
  --json "$tmp/np1.json" --save "$tmp/np1.ckpt" >/dev/null
"$bin" "${flags[@]}" --epochs 1 --json "$tmp/plain.json" --save "$tmp/plain.ckpt" >/dev/null
python3 - "$tmp" <<'PY'
import json, struct, sys
d = sys.argv[1]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
for x, y in (("two", "two_again"), ("np1", "plain")):
    a, b = (json.load(open(f"{d}/{n}.json")) for n in (x, y))
    assert a["step_loss"] == b["step_loss"] and a["test"] == b["test"], f"{x} and {y} differ"
    assert tensors(f"{d}/{x}.ckpt") == tensors(f"{d}/{y}.ckpt"), f"{x} and {y}: checkpoint tensors differ"
print("bit-identical: a repeated 2-rank run, and mpirun -np 1 against one plain process")
PY

# A global batch of 15 does not split over 2 ranks: refused before any training, exit status 2.
set +e
"${two[@]}" train --data "$tmp/data.csv" --seed 3 --lr 0.003 --epochs 1 --batch-size 15 >"$tmp/bad.log" 2>&1
status=$?
set -e
test "$status" -eq 2 || { cat "$tmp/bad.log"; echo "FAIL: exit status $status, expected 2"; exit 1; }
grep -q -- "--batch-size 15 is the global batch and must divide by the 2 ranks" "$tmp/bad.log"

# Resume across rank counts: 2 epochs on 2 ranks then the 3rd on 1, and 2 epochs on 1 then the 3rd on 2, both
# end where 3 epochs in one process end.
"${two[@]}" "${flags[@]}" --epochs 2 --save "$tmp/a.ckpt" >/dev/null
"$bin" "${flags[@]}" --epochs 3 --resume "$tmp/a.ckpt" --json "$tmp/a.json" >"$tmp/a.log"
grep -q "resumed from" "$tmp/a.log"
"$bin" "${flags[@]}" --epochs 2 --save "$tmp/b.ckpt" >/dev/null
"${two[@]}" "${flags[@]}" --epochs 3 --resume "$tmp/b.ckpt" --json "$tmp/b.json" >"$tmp/b.log"
grep -q "resumed from" "$tmp/b.log"
python3 - "$tmp/one.json" "$tmp/a.json" "$tmp/b.json" <<'PY'
import json, sys
one, a, b = (json.load(open(p)) for p in sys.argv[1:4])
for name, r in (("2 -> 1 ranks", a), ("1 -> 2 ranks", b)):
    d = abs(r["test"]["loss"] - one["test"]["loss"])
    assert d < 1e-4, f"{name}: test loss {r['test']['loss']} vs {one['test']['loss']} uninterrupted"
    assert abs(r["test"]["accuracy"] - one["test"]["accuracy"]) <= 0.001
    print(f"resume {name}: test loss within {d:.1e} of the uninterrupted run")
PY
# Resume on the same two ranks with Dropout (the cnn, on 4x4 images: a 16-feature CSV): the resumed run ends bit-identical to the uninterrupted one, masks of rank 1 included. A constant rate:
# the default schedule's length follows --epochs, which differs between the two halves.
python3 - "$tmp/images.csv" <<'PY'
import random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:
    f.write(",".join(f"p{i}" for i in range(16)) + ",label\n")
    for i in range(640):
        c = i % 3
        f.write(",".join(f"{random.gauss(1.0 if j % 3 == c else 0.0, 1.0):.4f}" for j in range(16)) + f",{c}\n")
PY
cnn=(train --model cnn --data "$tmp/images.csv" --batch-size 32 --seed 3 --lr-schedule constant --warmup-steps 0)
"${two[@]}" "${cnn[@]}" --epochs 3 --json "$tmp/cnn_full.json" >/dev/null
"${two[@]}" "${cnn[@]}" --epochs 2 --save "$tmp/cnn.ckpt" >/dev/null
"${two[@]}" "${cnn[@]}" --epochs 3 --resume "$tmp/cnn.ckpt" --json "$tmp/cnn_resumed.json" >/dev/null
python3 - "$tmp/cnn_full.json" "$tmp/cnn_resumed.json" <<'PY'
import json, sys
full, resumed = (json.load(open(p))["test"] for p in sys.argv[1:3])
assert full == resumed, f"2 -> 2 ranks with dropout: resumed {resumed} vs uninterrupted {full}"
print(f"resume 2 -> 2 ranks with dropout: test loss {full['loss']!r} in both")
PY
# --sync-batch-norm: the CNN's BatchNormalization over the global batch. 833 training rows in batches of 32 leave a
# last batch of 1 sample, so rank 1 has none in that step and takes part in the layer's exchanges without samples.
# With the same seed the dropout masks are the same with and without the flag, so the two 2-rank runs differ by
# the statistics alone; on one process the flag changes nothing (bit for bit).
python3 - "$tmp/images833.csv" <<'PY'
import random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:  # 972 rows: 833 training, 139 test
    f.write(",".join(f"p{j}" for j in range(16)) + ",label\n")
    for i in range(972):
        c = i % 3
        f.write(",".join(f"{random.gauss(1.2 if j % 4 == c else 0.0, 1.0):.4f}" for j in range(16)) + f",{c}\n")
PY
sbn=(train --model cnn --data "$tmp/images833.csv" --batch-size 32 --seed 3 --epochs 2 --validation-split 0)
"${two[@]}" "${sbn[@]}" --sync-batch-norm --json "$tmp/sbn.json" >"$tmp/sbn.log"
grep -q '^data-parallel: 2 ranks (mpi), global batch 32 = 2 x 16 rows per rank, BatchNormalization synchronized' \
  "$tmp/sbn.log"
"${two[@]}" "${sbn[@]}" --json "$tmp/sbn_off.json" >/dev/null
"$bin" "${sbn[@]}" --sync-batch-norm --json "$tmp/sbn_one.json" >/dev/null
"$bin" "${sbn[@]}" --json "$tmp/sbn_one_off.json" >/dev/null
python3 - "$tmp" <<'PY'
import json, math, sys
d = sys.argv[1]
on, off, one, one_off = (json.load(open(f"{d}/{n}.json")) for n in ("sbn", "sbn_off", "sbn_one", "sbn_one_off"))
assert on["synchronized_batch_norm"] is True and off["synchronized_batch_norm"] is False
assert len(on["step_loss"]) == 2 * 27, len(on["step_loss"])  # 26 full batches and the 1-sample one, per epoch
assert all(math.isfinite(v) for v in on["step_loss"]) and math.isfinite(on["test"]["loss"])
assert on["step_loss"] != off["step_loss"], "--sync-batch-norm did not reach the layers"
assert one["step_loss"] == one_off["step_loss"] and one["test"] == one_off["test"], "one process: the flag must change nothing"
print(f"--sync-batch-norm on 2 ranks with an empty shard: test accuracy {on['test']['accuracy']:.4f} "
      f"(per-rank statistics {off['test']['accuracy']:.4f})")
PY
# bench step and compare under mpirun: the step's samples/s and communication share, one report from rank 0.
"${two[@]}" bench step --model mlp --hidden 64 --batch-size 32 --steps 3 --json "$tmp/bench.json" >"$tmp/bench.log"
grep -q '^data-parallel: 2 ranks (mpi), .* of step time in communication' "$tmp/bench.log"
"${two[@]}" compare --data "$tmp/data.csv" --epochs 1 --batch-size 32 --policies float32,mixed_bfloat16 \
  --baseline-seeds 2 --out "$tmp/cmp" >"$tmp/cmp.log"
test -s "$tmp/cmp/report.json" && test -s "$tmp/cmp/report.html"
test "$(grep -c '^mixed_bfloat16: ' "$tmp/cmp.log")" -eq 1
python3 - "$tmp/bench.json" "$tmp/cmp/report.json" <<'PY'
import json, sys
b, c = (json.load(open(p)) for p in sys.argv[1:3])
assert b["ranks"] == 2 and 0 <= b["communication_share"] <= 1 and b["samples_per_second"] > 0, b
assert b["communication_bytes_per_step_per_rank"] > 0 and b["communicator"] == "mpi", b
assert c["policies"]["float32"]["ranks"] == 2
print(f"bench step on 2 ranks: {b['samples_per_second']:.0f} samples/s, {100 * b['communication_share']:.0f}% communication")
PY
echo "cli two ranks ok"
