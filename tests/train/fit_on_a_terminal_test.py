# Runs a program whose fit() keeps the default verbose (1) with a pseudo-terminal as its standard output, as a
# user at a terminal runs it: each epoch must draw Keras' progress bar in place (an ETA while it runs, the full
# bar at the end), where a pipe or a file gets one summary line per epoch (tests/train/fit_verbose_test.cpp).
import os
import pty
import sys

program = sys.argv[1]
pid, fd = pty.fork()
if pid == 0:
    os.execv(program, [program])
chunks = []
while True:
    try:
        data = os.read(fd, 4096)
    except OSError:  # EIO: the program exited and closed the terminal
        break
    if not data:
        break
    chunks.append(data)
_, status = os.waitpid(pid, 0)
text = b"".join(chunks).decode(errors="replace")
print(text)
failures = []
if os.waitstatus_to_exitcode(status) != 0:
    failures.append(f"{program} exited with {os.waitstatus_to_exitcode(status)}")
epochs = text.count("Epoch ")
if epochs == 0:
    failures.append("no 'Epoch N/M' line")
if "ETA: " not in text:
    failures.append("no bar drawn while an epoch runs (no 'ETA: ')")
if text.count("[" + "=" * 30 + "]") < epochs:
    failures.append("not every epoch ends with the full bar")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
