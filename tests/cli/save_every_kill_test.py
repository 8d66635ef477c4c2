#!/usr/bin/env python3
"""`mixtrain train --save-every 1` SIGKILLed at random moments and resumed with --resume each time ends with the
checkpoint and the JSON report of an uninterrupted run, bit for bit.

Usage: save_every_kill_test.py MIXTRAIN [KILLS] [--FLAG VALUE ...]: the flags replace the run's own (or join
them), e.g. --accumulate 4 --epochs 2 for kills that land inside accumulations.
A mixed_float16 MLP (so the dynamic loss scale's state is part of
what must survive) on a small synthetic CSV, one thread. Each run is killed after a random delay; the next one
resumes from whatever checkpoint the killed one left (or starts afresh when it left none). A series ends when a run
finishes on its own; its checkpoint and report are then compared with the uninterrupted run's, and another series
starts until KILLS kills (default 20) have landed. MIXTRAIN_KILL_SEED fixes the delays (printed on every run).
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from checkpoint_files import fit_state_without_timing, read_safetensors, without_timing, write_blobs_csv

mixtrain = sys.argv[1]
kills_wanted = int(sys.argv[2]) if len(sys.argv) > 2 else 20
seed = int(os.environ.get("MIXTRAIN_KILL_SEED", str(time.time_ns() % 2**32)))
print(f"kill delays from seed {seed} (MIXTRAIN_KILL_SEED={seed} repeats them)")
rnd = random.Random(seed)
tmp = tempfile.mkdtemp(prefix="mixtrain_save_every_kill_")
env = dict(os.environ, OMP_NUM_THREADS="1")

# Three Gaussian blobs, 480 rows: 24 steps of 16 rows per epoch after the test and validation splits.
data = os.path.join(tmp, "blobs.csv")
write_blobs_csv(data)

flags = ["train", "--data", data, "--policy", "mixed_float16", "--hidden", "32", "--batch-size", "16",
         "--epochs", "6", "--seed", "3", "--save-every", "1"]
extra = sys.argv[3:]
for name, value in zip(extra[::2], extra[1::2]):
    if name in flags:
        flags[flags.index(name) + 1] = value
    else:
        flags[-2:-2] = [name, value]  # before --save-every 1, which the runs below strip from the end
print("flags:", " ".join(flags[1:]))


start = time.monotonic()
full_ckpt, full_json = os.path.join(tmp, "full.safetensors"), os.path.join(tmp, "full.json")
subprocess.run([mixtrain, *flags, "--save", full_ckpt, "--json", full_json], env=env, check=True,
               stdout=subprocess.DEVNULL)
full_seconds = time.monotonic() - start
full_tensors, full_meta = read_safetensors(full_ckpt)
full_report = json.load(open(full_json))
steps = len(full_report["step_loss"])
print(f"uninterrupted: {steps} steps in {full_seconds:.2f} s")
# A run with nothing left to train (resumed from the finished checkpoint): the start-up, data load, checkpoint
# load and final evaluation every run pays.
start_up = time.monotonic()
subprocess.run([mixtrain, *flags[:-2], "--resume", full_ckpt], env=env, check=True, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL)
start_up = time.monotonic() - start_up
training = max(full_seconds - start_up, 0.05)
print(f"start-up and evaluation alone: {start_up:.2f} s")
# One kill in five lands in the start-up (data or checkpoint load); the others after it, up to twice the time
# of a run's steps divided by the kills, so the kills of a series together reach about its end.
def kill_delay():
    if rnd.random() < 0.2:
        return rnd.uniform(0, start_up)
    return start_up + rnd.uniform(0, 2 * training / kills_wanted)

failures = []
kills = 0
mid_save = 0
series = 0
positions = []  # (epoch, step) each resume started from
while kills < kills_wanted:
    series += 1
    ckpt, report = os.path.join(tmp, f"s{series}.safetensors"), os.path.join(tmp, f"s{series}.json")
    while True:
        args = [mixtrain, *flags, "--save", ckpt, "--json", report]
        if os.path.exists(ckpt):
            _, meta = read_safetensors(ckpt)
            positions.append((int(meta["epoch"]), int(meta.get("step", 0))))
            args += ["--resume", ckpt]
        err_path = os.path.join(tmp, "stderr")
        with open(err_path, "w") as err:
            p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err)
            delay = kill_delay()
            try:
                rc = p.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                if kills < kills_wanted:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                    kills += 1
                    # A temp file left behind: the kill landed inside a save (the next save removes it).
                    mid_save += any(".tmp." in f for f in os.listdir(tmp))
                    continue
                rc = p.wait()  # enough kills: let the series finish
        if rc != 0:
            failures.append(f"series {series}: a run exited {rc}: {open(err_path).read().strip()}")
        break
    if failures:
        break
    tensors, meta = read_safetensors(ckpt)
    if set(tensors) != set(full_tensors):
        failures.append(f"series {series}: tensors {sorted(set(tensors) ^ set(full_tensors))} differ in presence")
    for name in sorted(set(tensors) & set(full_tensors)):
        if tensors[name] != full_tensors[name]:
            failures.append(f"series {series}: tensor '{name}' differs from the uninterrupted run's")
    for key in ("format", "epoch", "step", "seed", "config"):
        if meta.get(key) != full_meta.get(key):
            failures.append(f"series {series}: metadata '{key}' {meta.get(key)!r} != {full_meta.get(key)!r}")
    if fit_state_without_timing(meta) != fit_state_without_timing(full_meta):
        failures.append(f"series {series}: the saved fit state (history) differs from the uninterrupted run's")
    if without_timing(json.load(open(report))) != without_timing(full_report):
        failures.append(f"series {series}: the JSON report differs from the uninterrupted run's")
    leftovers = [f for f in os.listdir(tmp) if ".tmp." in f]
    if leftovers:
        failures.append(f"series {series}: temporary files left: {leftovers}")
    print(f"series {series}: done after {kills} kills in all; checkpoint and report identical: "
          f"{not failures}")
    if failures:
        break

mid = sum(1 for e, s in positions if s > 0)
print(f"{kills} kills in {series} series ({mid_save} inside a save), {len(positions)} resumes ({mid} inside an "
      f"epoch, {len(set(positions))} distinct positions), {time.monotonic() - start:.1f} s")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    print(f"files kept in {tmp}")
    sys.exit(1)
for f in os.listdir(tmp):
    os.remove(os.path.join(tmp, f))
os.rmdir(tmp)
print("ok: every series ended bit-identical to the uninterrupted run")
