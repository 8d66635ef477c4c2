#!/usr/bin/env bash
# Small files that expand without bound in memory (issue 40, finding 3) are refused before they expand, under a
# 2 GB address-space limit, with one line naming the file and the input budget, exit status 2: a 39 KB gzip of one
# 20-million-cell line, a few MB of gzip holding 2 GB of valid rows, a text of 1.1 million distinct characters,
# a safetensors header of 1.38 million tiny tensors. Before, they took 1.3 to 4.9 GB or ran out of memory (exit 1).
set -u
bin="$1"
. "$(dirname "$0")/lib.sh"
start_checks

python3 - "$tmp" <<'PY'
import gzip, json, struct, sys, zlib
d = sys.argv[1]
with gzip.open(f"{d}/wide.csv.gz", "wb", 9) as f:
    f.write(b"0," * (20_000_000 - 1) + b"0\n")
# 2 GB of rows as 128 copies of one 16 MiB gzip member (a gzip file may hold several members, read as one text).
member = gzip.compress(b"1.0,2.0,3.0,4.0,5.0,6.0,7.0,0\n" * ((16 << 20) // 30), 9)
with open(f"{d}/rows.csv.gz", "wb") as f:
    for _ in range(128): f.write(member)
cps = [c for c in range(0x20, 0x110000) if not 0xD800 <= c <= 0xDFFF][:1_100_000]
open(f"{d}/distinct.txt", "wb").write("".join(map(chr, cps)).encode())
n = 1_380_000
h = json.dumps({f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)},
               separators=(",", ":")).encode()
open(f"{d}/many.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(n))
PY

# refused NAME ARGS...: exit 2 within 30 s under ulimit -v 2000000, one line naming the file and the budget.
refused() {
  local name="$1"; shift
  local start=$SECONDS
  (ulimit -v 2000000; timeout 60 "$bin" "$@" >"$tmp/out" 2>"$tmp/err")
  local rc=$? took=$((SECONDS - start))
  if [ $rc -ne 2 ]; then fail "$* exited $rc, expected 2: $(head -c 400 "$tmp/err")"; return; fi
  grep -qF "'$tmp/$name'" "$tmp/err" || { fail "$*: the error does not name $name: $(cat "$tmp/err")"; return; }
  grep -qF "more than the input budget of" "$tmp/err" || { fail "$*: not the input budget: $(cat "$tmp/err")"; return; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { fail "$*: the error is not one line: $(cat "$tmp/err")"; return; }
  [ $took -le 30 ] || { fail "$*: took $took s"; return; }
  echo "ok ($took s): $(cat "$tmp/err")"
}

refused wide.csv.gz train --data "$tmp/wide.csv.gz" --epochs 1
refused rows.csv.gz train --data "$tmp/rows.csv.gz" --epochs 1
refused distinct.txt train --data "text:$tmp/distinct.txt" --model transformer --steps 2
refused many.safetensors generate --checkpoint "$tmp/many.safetensors" --prompt a
# The budget is the user's to raise or lower: a lowered one refuses a small real file, naming the variable.
printf 'a,b,label\n1,2,0\n3,4,1\n' >"$tmp/small.csv"
MIXTRAIN_INPUT_BUDGET=16 "$bin" train --data "$tmp/small.csv" --epochs 1 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -qF "MIXTRAIN_INPUT_BUDGET" "$tmp/err" || fail "MIXTRAIN_INPUT_BUDGET=16: exit $rc: $(cat "$tmp/err")"
MIXTRAIN_INPUT_BUDGET=lots "$bin" train --data "$tmp/small.csv" --epochs 1 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -qF "MIXTRAIN_INPUT_BUDGET expects a positive size" "$tmp/err" ||
  fail "MIXTRAIN_INPUT_BUDGET=lots: exit $rc: $(cat "$tmp/err")"
exit "$fails"
