#!/usr/bin/env bash
# The CSV layouts of public data sets, read with the CLI's CSV flags: a headerless file (--csv-header no, and
# auto), the label in the first column chosen by name or by index (--label-column), and a gzip-compressed file.
# Each trains one epoch with train, and compare and inspect accept the same flags; bad values exit with status 2
# and a one-line message naming the flag and what it accepts.
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
start_checks

# Two classes separated along the second feature; 350 rows = 300 training + 50 held-out test rows.
python3 - "$tmp" <<'PY'
import gzip, random, sys
random.seed(5)
rows = []
for i in range(350):
    c = i % 2
    rows.append((c, [random.gauss(0, 1), 3.0 * (2 * c - 1) + random.gauss(0, 1), random.random()]))
def line(features): return ",".join(f"{v:.4f}" for v in features)
d = sys.argv[1]
with open(f"{d}/headerless.csv", "w") as f:  # label last, no header: the most common public layout
    for c, x in rows: f.write(f"{line(x)},{c}\n")
with open(f"{d}/label_first.csv", "w") as f:  # the label first, named in a header row
    f.write("species,petal,sepal,stem\n")
    for c, x in rows: f.write(f"{c},{line(x)}\n")
with gzip.open(f"{d}/compressed.csv.gz", "wt") as f:
    f.write("a,b,c,label\n")
    for c, x in rows: f.write(f"{line(x)},{c}\n")
PY

# train_ok NAME args...: trains one epoch; the data line must show 300 + 50 samples of 3 features and 2 classes,
# and the held-out accuracy must show the label column was the one meant.
train_ok() {
  local name="$1"; shift
  if ! "$bin" train --epochs 1 --batch-size 16 --seed 1 --json "$tmp/$name.json" "$@" >"$tmp/$name.log" 2>&1; then
    fail "mixtrain train $* exited $?"; cat "$tmp/$name.log"; return
  fi
  grep -q "300 training and 50 held-out test samples, 3 features, 2 classes" "$tmp/$name.log" ||
    { fail "$name: unexpected data line"; cat "$tmp/$name.log"; return; }
  python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['test']['accuracy']; sys.exit(0 if a > 0.9 else 1)" \
    "$tmp/$name.json" || { fail "$name: test accuracy too low"; cat "$tmp/$name.log"; return; }
  echo "ok: train $* -> $(grep '^data:' "$tmp/$name.log")"
}

train_ok headerless_no --data "$tmp/headerless.csv" --csv-header no
train_ok headerless_auto --data "$tmp/headerless.csv" --csv-header auto
train_ok headerless_default --data "$tmp/headerless.csv"
train_ok label_by_name --data "$tmp/label_first.csv" --label-column species
train_ok label_by_index --data "$tmp/label_first.csv" --label-column 0 --csv-header yes
train_ok label_by_negative_index --data "$tmp/label_first.csv" --label-column=-4
train_ok gzip --data "$tmp/compressed.csv.gz"
train_ok gzip_by_name --data "$tmp/compressed.csv.gz" --label-column label --csv-header yes

# compare and inspect read CSV data the same way.
if "$bin" compare --data "$tmp/label_first.csv" --label-column species --csv-header yes --policies float32 \
     --baseline-seeds 1 --epochs 1 --batch-size 16 --out "$tmp/compare" >"$tmp/compare.log" 2>&1 &&
   grep -q "3 features, 2 classes" "$tmp/compare.log"; then
  echo "ok: compare --label-column species"
else
  fail "compare with --label-column"; cat "$tmp/compare.log"
fi
if "$bin" inspect --data "$tmp/compressed.csv.gz" --label-column 3 --steps 2 --batch-size 16 >"$tmp/inspect.log" 2>&1; then
  echo "ok: inspect --label-column 3"
else
  fail "inspect with --label-column"; cat "$tmp/inspect.log"
fi

# expect_error "<substring of the message>" args...: exit status 2 and a one-line message holding the substring.
expect_error() {
  local want="$1"; shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "mixtrain $* exited $rc, expected 2"; cat "$tmp/err"; return; fi
  grep -qF -- "$want" "$tmp/err" || { fail "mixtrain $*: stderr lacks '$want':"; cat "$tmp/err"; return; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { fail "mixtrain $*: error is not one line:"; cat "$tmp/err"; return; }
  echo "ok: $* -> $(cat "$tmp/err")"
}

csv="$tmp/label_first.csv"
expect_error "--csv-header must be auto, yes or no, got 'maybe'" train --data "$csv" --csv-header maybe
expect_error "--csv-header must be auto, yes or no, got ''" train --data "$csv" --csv-header=
expect_error "--csv-header must be auto, yes or no, got 'YES'" compare --data "$csv" --csv-header YES
expect_error "--csv-header must be auto, yes or no" inspect --data "$csv" --csv-header 1
expect_error "--label-column needs a column NAME from the header row or a 0-based INDEX" train --data "$csv" --label-column=
expect_error "no column is named 'label'" train --data "$csv" --label-column label --epochs 1
expect_error "label column index 4 is outside" train --data "$csv" --label-column 4 --epochs 1
expect_error "--label-column must be an integer from" train --data "$csv" --label-column 99999999999 --epochs 1
expect_error "--csv-header applies to CSV data, not to --data fashion-mnist" train --csv-header no
expect_error "--label-column applies to CSV data, not to --data moby-dick" train --model transformer --data moby-dick --label-column 0
# A header row declared absent: its names are not numbers, the label column by name has no header to look in.
expect_error "headerless.csv" train --data "$tmp/headerless.csv" --csv-header yes --epochs 1
expect_error "label_first.csv" train --data "$csv" --csv-header no --epochs 1
expect_error "species" train --data "$csv" --csv-header no --label-column species --epochs 1
# Their hints name the CLI's flags.
expect_error "read the file as headerless (--csv-header no or auto" train --data "$tmp/headerless.csv" --csv-header yes --epochs 1
expect_error "choose the label column by index (--label-column 0, 1" train --data "$csv" --csv-header no --label-column species --epochs 1
expect_error "the label column (--label-column NAME" train --data "$csv" --csv-header yes --label-column nope --epochs 1
# The label column's cells must be class ids: the last column of label_first.csv holds fractions.
expect_error "label_first.csv" train --data "$csv" --epochs 1
"$bin" --help | grep -q -- "--csv-header auto|yes|no" || fail "--help does not show --csv-header"
"$bin" --help | grep -q -- "--label-column NAME|INDEX" || fail "--help does not show --label-column"

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "csv options ok"
