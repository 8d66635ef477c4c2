#!/usr/bin/env bash
# `mpirun -np 2 mixtrain train --zero 1` (ZeRO stage 1: the optimizer state split over the ranks): the run ends
# where plain data parallelism on the same ranks ends (weights and optimizer state within 1e-6), its checkpoints
# hold the whole state in the usual format and resume across rank counts (2 -> 1 -> 2 and 1 -> 2 -> 1, under
# mixed_float16 with its loss scale) at the uninterrupted run's weights; --zero 1 on one process trains as
# without it; a bad --zero value and a refused combination exit 2 with one line.
# Usage: cli_zero_test.sh MIXTRAIN MPIEXEC
set -eu
. "$(dirname "$0")/two_ranks_lib.sh"
write_blobs_csv "$tmp/data.csv" 640
# A constant rate: the default schedule's length follows --epochs, which differs between the parts of a resume.
flags=(train --data "$tmp/data.csv" --batch-size 32 --seed 3 --lr 0.003 --hidden 33,17 --lr-schedule constant
       --warmup-steps 0 --clipnorm 0.5)

# Checkpoint tensors as floats (F32, F16, BF16, I32), by name; the largest relative difference of two files.
cat >"$tmp/compare.py" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__" or k.startswith("rng/"):
            continue
        raw = b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        if v["dtype"] == "F32":
            out[k] = struct.unpack(f"<{len(raw) // 4}f", raw)
        elif v["dtype"] == "I32":
            out[k] = struct.unpack(f"<{len(raw) // 4}i", raw)
        elif v["dtype"] == "BF16":
            out[k] = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        elif v["dtype"] == "F16":
            out[k] = struct.unpack(f"<{len(raw) // 2}e", raw)
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), f"different entries: {sorted(a.keys() ^ b.keys())}"
worst = max(abs(x - y) / (1 + abs(y)) for k in a for x, y in zip(a[k], b[k]))
assert all(len(a[k]) == len(b[k]) for k in a)
limit = float(sys.argv[4])
assert worst <= limit, f"{sys.argv[3]}: largest relative difference {worst:.3g} > {limit}"
print(f"{sys.argv[3]}: largest relative difference {worst:.3g} over {len(a)} tensors")
PY

"${two[@]}" "${flags[@]}" --epochs 2 --save "$tmp/plain.ckpt" >/dev/null
"${two[@]}" "${flags[@]}" --epochs 2 --zero 1 --save "$tmp/zero.ckpt" >"$tmp/zero.log"
grep -q 'ZeRO-1: optimizer state split over the ranks' "$tmp/zero.log"
python3 "$tmp/compare.py" "$tmp/zero.ckpt" "$tmp/plain.ckpt" "ZeRO-1 = plain data parallel" 1e-6

# Resumes, mixed_float16 (the loss scale and its skips travel in the checkpoint). On the same two ranks: the
# uninterrupted run's weights and state. Across rank counts (2 -> 1 -> 2, 1 -> 2 -> 1): those of plain data
# parallelism resumed along the same ranks (an epoch on one rank sums its gradients in another float32 order than
# on two, so neither chain ends at a 2-rank uninterrupted run's bits; cli_two_ranks_test.sh bounds that).
mixed=("${flags[@]}" --policy mixed_float16)
"${two[@]}" "${mixed[@]}" --zero 1 --epochs 3 --save "$tmp/full.ckpt" >/dev/null
"${two[@]}" "${mixed[@]}" --zero 1 --epochs 1 --save "$tmp/s1.ckpt" >/dev/null
"${two[@]}" "${mixed[@]}" --zero 1 --epochs 3 --resume "$tmp/s1.ckpt" --save "$tmp/s3.ckpt" >/dev/null
python3 "$tmp/compare.py" "$tmp/s3.ckpt" "$tmp/full.ckpt" "resume on 2 ranks = uninterrupted" 1e-6
# chain NAME ZERO_FLAGS RANKS... : epoch k on the k-th rank count, resuming from epoch k-1's checkpoint.
chain() {
  local name="$1" zero="$2" k=0 from=() run
  shift 2
  for ranks in "$@"; do
    k=$((k + 1))
    if [ "$ranks" = 2 ]; then run=("${two[@]}"); else run=("$bin"); fi
    "${run[@]}" "${mixed[@]}" $zero --epochs "$k" "${from[@]}" --save "$tmp/$name$k.ckpt" >"$tmp/$name$k.log"
    from=(--resume "$tmp/$name$k.ckpt")
  done
}
chain z212 "--zero 1" 2 1 2
grep -q -- '--zero 1: one process, nothing to split' "$tmp/z2122.log"
chain p212 "" 2 1 2
python3 "$tmp/compare.py" "$tmp/z2123.ckpt" "$tmp/p2123.ckpt" "resume 2 -> 1 -> 2 ranks = plain data parallel" 1e-6
python3 "$tmp/compare.py" "$tmp/z2123.ckpt" "$tmp/full.ckpt" "resume 2 -> 1 -> 2 ranks against uninterrupted" 1e-3
chain z121 "--zero 1" 1 2 1
chain p121 "" 1 2 1
python3 "$tmp/compare.py" "$tmp/z1213.ckpt" "$tmp/p1213.ckpt" "resume 1 -> 2 -> 1 ranks = plain data parallel" 1e-6

# One process: --zero 1 changes nothing.
"$bin" "${flags[@]}" --epochs 1 --save "$tmp/one_plain.ckpt" >/dev/null
"$bin" "${flags[@]}" --epochs 1 --zero 1 --save "$tmp/one_zero.ckpt" >/dev/null
python3 "$tmp/compare.py" "$tmp/one_zero.ckpt" "$tmp/one_plain.ckpt" "--zero 1 on one process" 0

# Refused: one line, exit status 2.
refused() {
  set +e
  "$bin" "${flags[@]}" --epochs 1 "$@" >"$tmp/bad.log" 2>&1
  local status=$?
  set -e
  test "$status" -eq 2 || { cat "$tmp/bad.log"; echo "FAIL: $* exited $status, expected 2"; exit 1; }
  test "$(grep -c . "$tmp/bad.log")" -eq 1 || { cat "$tmp/bad.log"; echo "FAIL: $*: expected one line"; exit 1; }
  grep -q -- "$1" "$tmp/bad.log" || { cat "$tmp/bad.log"; echo "FAIL: $*: the message does not name $1"; exit 1; }
}
refused --zero 2
refused --zero 1 --policy bfloat16 --master-rounding stochastic
echo "cli zero: all checks passed"
