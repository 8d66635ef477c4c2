#!/usr/bin/env python3
"""`train --resume` with a larger --steps or --epochs trains on to the new end (it trained nothing and exited 0
telling the user to raise --steps, which they had): a run by steps keeps the checkpoint's evaluation interval, and
the learning-rate schedule runs over the new length, as a run started with it does.

Usage: resume_longer_test.py MIXTRAIN
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

from checkpoint_files import read_safetensors

mixtrain = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="mixtrain_resume_longer_")
env = dict(os.environ, OMP_NUM_THREADS="1")
failures = []

text = os.path.join(tmp, "words.txt")
rnd = random.Random(1)
words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]
with open(text, "w") as f:
    f.write(" ".join(rnd.choice(words) for _ in range(3000)))
csv = os.path.join(tmp, "blobs.csv")
with open(csv, "w") as f:
    f.write(",".join(f"f{j}" for j in range(6)) + ",label\n")
    for i in range(300):
        f.write(",".join(f"{rnd.gauss(0, 1) + (1.5 if j % 3 == i % 3 else 0):.5f}" for j in range(6)) + f",{i % 3}\n")


def run(*args, expect=0):
    p = subprocess.run([mixtrain, "train", *args], env=env, capture_output=True, text=True)
    if p.returncode != expect:
        failures.append(f"train {' '.join(args)}: exit {p.returncode}, expected {expect}: {p.stderr.strip()}")
    return p


def tensors(path):
    """name -> raw bytes of each tensor in a checkpoint."""
    return {k: raw for k, (_, _, raw) in read_safetensors(path)[0].items()}


def path(name):
    return os.path.join(tmp, name)


tr = ["--model", "transformer", "--data", "text:" + text, "--width", "32", "--layers", "1", "--heads", "2",
      "--context", "16", "--batch-size", "8", "--warmup-steps", "0", "--seed", "5"]

# 1. The case: 20 steps (evaluated every 2), resumed with --steps 40. At a constant rate the result is
# the uninterrupted 40-step run's, evaluated every 2 steps, bit for bit.
const = tr + ["--lr-schedule", "constant"]
run(*const, "--steps", "20", "--save", path("c.st"))
p = run(*const, "--steps", "40", "--save", path("c.st"), "--resume", path("c.st"), "--json", path("c.json"))
if "nothing was trained" in p.stderr:
    failures.append("--steps 40 resumed from a 20-step checkpoint trained nothing")
if "evaluating every 2 steps" not in p.stdout:
    failures.append("the resumed run does not say it keeps the checkpoint's evaluation interval")
run(*const, "--steps", "40", "--eval-every", "2", "--save", path("c_full.st"), "--json", path("c_full.json"))
if os.path.exists(path("c.json")):
    got, want = json.load(open(path("c.json"))), json.load(open(path("c_full.json")))
    if len(got["step_loss"]) != 40 or got["step_loss"] != want["step_loss"]:
        failures.append(f"steps 20 -> 40: {len(got['step_loss'])} step losses, not the uninterrupted run's 40")
    if [e["step"] for e in got["epochs"]] != [e["step"] for e in want["epochs"]]:
        failures.append("steps 20 -> 40: the report's evaluation steps differ from the uninterrupted run's")
    if tensors(path("c.st")) != tensors(path("c_full.st")):
        failures.append("steps 20 -> 40: the final checkpoint differs from the uninterrupted run's")

# 2. The cosine schedule runs over the new length: after step 30 of a 20-step run resumed to 40, the optimizer's
# rate is the 40-step run's at step 30 (the old schedule would hold its floor, 0.1 x, from step 20 on).
cos = tr + ["--lr-schedule", "cosine"]
run(*cos, "--steps", "20", "--save", path("r{epoch}.st"))
run(*cos, "--steps", "40", "--save", path("r{epoch}.st"), "--resume", path("r10.st"))
run(*cos, "--steps", "40", "--eval-every", "2", "--save", path("u{epoch}.st"))
if os.path.exists(path("r15.st")) and os.path.exists(path("u15.st")):
    lr_resumed = tensors(path("r15.st"))["optimizer/learning_rate"]
    lr_full = tensors(path("u15.st"))["optimizer/learning_rate"]
    lr_old_end = tensors(path("r10.st"))["optimizer/learning_rate"]
    if lr_resumed != lr_full:
        failures.append(f"cosine 20 -> 40: the rate at step 30 is {struct.unpack('<f', lr_resumed)}, the 40-step "
                        f"run's is {struct.unpack('<f', lr_full)}")
    if lr_resumed == lr_old_end:
        failures.append("cosine 20 -> 40: the rate stayed at the 20-step schedule's end")
else:
    failures.append("cosine 20 -> 40: no checkpoint after step 30")

# 3. Another explicit --eval-every than the checkpoint's cannot be resumed: refused, naming both.
p = run(*const, "--steps", "40", "--eval-every", "5", "--resume", path("c.st"), expect=2)
if "--eval-every 5" not in p.stderr or "(2 steps)" not in p.stderr or len(p.stderr.strip().splitlines()) != 1:
    failures.append(f"--eval-every 5 on a 2-step-interval checkpoint: {p.stderr.strip()!r}")

# 4. By epochs: 2 epochs resumed with --epochs 4 equal 4 uninterrupted epochs.
mlp = ["--data", csv, "--hidden", "16", "--batch-size", "32", "--seed", "2"]
run(*mlp, "--epochs", "2", "--save", path("m.st"))
p = run(*mlp, "--epochs", "4", "--save", path("m.st"), "--resume", path("m.st"))
run(*mlp, "--epochs", "4", "--save", path("m_full.st"))
if "nothing was trained" in p.stderr or tensors(path("m.st")) != tensors(path("m_full.st")):
    failures.append("epochs 2 -> 4: the resumed run does not end as 4 uninterrupted epochs")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    print(f"files kept in {tmp}")
    sys.exit(1)
for f in os.listdir(tmp):
    os.remove(os.path.join(tmp, f))
os.rmdir(tmp)
print("ok: runs resumed with a larger --steps or --epochs train on to the new end")
