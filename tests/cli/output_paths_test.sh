#!/usr/bin/env bash
# Output paths never destroy anything, and inputs that cannot be sized never hang: a FIFO, device node or
# directory in an output's place is refused and left as it was; a symbolic link is followed (its target written,
# the link kept); an output equal to an input or to another output is refused (--save equal to --resume is
# allowed); a FIFO given as a checkpoint to read is refused at once. Every refusal: one line, exit status 2.
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# expect_error "<substring of the message>" args... (under a timeout: a hang is a failure, not a stuck test)
expect_error() {
  local want="$1"; shift
  timeout 60 "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || { fail "mixtrain $* exited $rc, expected 2"; cat "$tmp/err"; return; }
  grep -qF -- "$want" "$tmp/err" || { fail "mixtrain $*: stderr lacks '$want':"; cat "$tmp/err"; return; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { fail "mixtrain $*: error is not one line:"; cat "$tmp/err"; return; }
  echo "ok: $* -> $(cat "$tmp/err")"
}

cd "$tmp" || exit 1
python3 -c "
print('a,b,label')
for i in range(60): print(f'{i % 7},{i % 5},{i % 2}')" >d.csv
quick=(train --data d.csv --epochs 1 --hidden 8)
mkfifo fifo

# Not regular files: refused before training, and still there afterwards.
expect_error "--json 'fifo' is a FIFO (named pipe), not a regular file" "${quick[@]}" --json fifo
expect_error "--save 'fifo' is a FIFO (named pipe), not a regular file" "${quick[@]}" --save fifo
[ -p fifo ] || fail "the FIFO was replaced"
mkdir outdir
expect_error "--save 'outdir' is a directory, not a regular file" "${quick[@]}" --save outdir
if mknod null c 1 3 2>/dev/null; then
  expect_error "--save 'null' is a character device, not a regular file" "${quick[@]}" --save null
  [ -c null ] || fail "the device node was replaced"
else
  echo "skip: mknod needs privileges here; /dev/null through a link instead"
fi
ln -s /dev/null tonull
expect_error "--json 'tonull' links to '/dev/null', which is a character device" "${quick[@]}" --json tonull
[ -c /dev/null ] || fail "/dev/null was replaced"

# An output that is an input or the other output of the same run.
cp d.csv keep.csv
expect_error "--save d.csv is the same file as --data d.csv" "${quick[@]}" --save d.csv
ln -s d.csv alias.csv
expect_error "--json alias.csv is the same file as --data d.csv" "${quick[@]}" --json alias.csv
expect_error "--json r.out is the same file as --save ./r.out" "${quick[@]}" --json r.out --save ./r.out
cmp -s d.csv keep.csv || fail "the data file changed"

# A link is followed: the file it names is written, the link stays. --save equal to --resume is allowed.
ln -s real.safetensors ck.link
ln -s real.json report.link
timeout 120 "$bin" "${quick[@]}" --save ck.link --json report.link >/dev/null 2>&1 || fail "train --save LINK failed"
[ -L ck.link ] && [ -L report.link ] || fail "a link was replaced by a file"
[ -f real.safetensors ] && [ -f real.json ] || fail "the link's target was not written"
timeout 120 "$bin" train --data d.csv --epochs 2 --hidden 8 --resume ck.link --save ck.link >/dev/null 2>&1 \
  || fail "train --resume CK --save CK failed"
[ -L ck.link ] || fail "--resume LINK --save LINK replaced the link"
grep -qF '"epoch":"2"' real.safetensors || fail "the resumed run did not save epoch 2"
[ -z "$(ls ./*.tmp.* 2>/dev/null)" ] || fail "temporary files were left: $(ls ./*.tmp.*)"

# Two runs saving to one checkpoint: the second is refused while the first runs, naming its process; the lock
# ends with the first run (normally or killed), and its lock file goes with a normal end.
python3 -c "
print('a,b,label')
for i in range(3000): print(f'{i % 7},{i % 5},{i % 2}')" >long.csv
long=(train --data long.csv --epochs 200 --hidden 64 --save-every 1)
for ending in normal kill; do
  "$bin" "${long[@]}" --save shared.st >/dev/null 2>&1 &
  holder=$!
  for _ in $(seq 500); do [ "$(cat shared.st.lock 2>/dev/null)" = "$holder" ] && break; sleep 0.01; done
  [ "$(cat shared.st.lock 2>/dev/null)" = "$holder" ] || fail "the first run did not write its id into shared.st.lock"
  expect_error "--save shared.st is being written by another run (process $holder, which holds" \
    "${quick[@]}" --save shared.st
  if [ $ending = normal ]; then kill -TERM $holder; else kill -KILL $holder; fi
  wait $holder
  rc=$?
  [ $ending = kill ] || [ $rc -eq 143 ] || fail "the holder stopped by SIGTERM exited $rc, expected 143"
  [ $ending = kill ] || [ ! -e shared.st.lock ] || fail "the lock file outlived its run"
  timeout 120 "$bin" "${quick[@]}" --save shared.st >/dev/null 2>"$tmp/err" \
    || { fail "a run after the holder's $ending end was refused: $(cat "$tmp/err")"; }
  [ ! -e shared.st.lock ] || fail "the lock file outlived the run after the holder's $ending end"
  echo "ok: a second writer refused while the first ran; the path free again after its $ending end"
  rm -f shared.st
done

# compare --out: the report's files are checked before the runs.
mkdir cmp && mkfifo cmp/steps.csv
expect_error "--out file '$tmp/cmp/steps.csv' is a FIFO" compare --data "$tmp/d.csv" --epochs 1 --hidden 8 --out "$tmp/cmp"
[ -p cmp/steps.csv ] || fail "compare replaced the FIFO"

# Inputs that cannot be sized: refused at once, never waited on.
expect_error "--resume checkpoint 'fifo' is a FIFO (named pipe), not a regular file" "${quick[@]}" --resume fifo
expect_error "--resume checkpoint '/dev/zero' is a character device, not a regular file" "${quick[@]}" --resume /dev/zero
expect_error "'fifo' is not a regular file (a FIFO)" generate --checkpoint fifo

exit "$fails"
