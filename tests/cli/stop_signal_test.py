#!/usr/bin/env python3
"""`mixtrain train` stopped by SIGTERM, SIGINT or SIGHUP at random moments: each run finishes its step, writes the
checkpoint, leaves no temporary file and exits with 128 + the signal (143, 130, 129); resumed with --resume to the
end, it gives the checkpoint and the JSON report of an uninterrupted run, bit for bit. A second signal ends the
process at once, and when it lands inside the save the first one asked for, the half-written temporary file is
removed and the last complete checkpoint stays. A SIGHUP the process was started with ignored (nohup) stays ignored.

Usage: stop_signal_test.py MIXTRAIN [TRIALS]. MIXTRAIN_STOP_SEED fixes the delays (printed; the moments a run
reaches depend on the machine's load all the same).
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
trials = int(sys.argv[2]) if len(sys.argv) > 2 else 10
seed = int(os.environ.get("MIXTRAIN_STOP_SEED", str(time.time_ns() % 2**32)))
print(f"signal delays from seed {seed} (MIXTRAIN_STOP_SEED={seed} repeats them)")
rnd = random.Random(seed)
tmp = tempfile.mkdtemp(prefix="mixtrain_stop_signal_")
env = dict(os.environ, OMP_NUM_THREADS="1")

# Three Gaussian blobs, 480 rows: 24 steps of 16 rows per epoch after the splits, 144 in all.
data = os.path.join(tmp, "blobs.csv")
write_blobs_csv(data)

# mixed_float16, so the dynamic loss scale's state must survive too. The trials save every 4 steps or every 25:
# the saves' fsyncs take most of a run's time, so with 4 most stops land right after a step save (the stop then
# has nothing new to write), with 25 most land between two (the stop writes the checkpoint itself).
flags = ["train", "--data", data, "--policy", "mixed_float16", "--hidden", "32", "--batch-size", "16",
         "--epochs", "6", "--seed", "3"]
failures = []


def temp_files():
    return [f for f in os.listdir(tmp) if ".tmp." in f]


start = time.monotonic()
full_ckpt, full_json = os.path.join(tmp, "full.safetensors"), os.path.join(tmp, "full.json")
subprocess.run([mixtrain, *flags, "--save-every", "4", "--save", full_ckpt, "--json", full_json], env=env,
               check=True, stdout=subprocess.DEVNULL)
full_seconds = time.monotonic() - start
full_tensors, full_meta = read_safetensors(full_ckpt)
full_report = json.load(open(full_json))
steps = len(full_report["step_loss"])
# The same run saving every 25 steps: its length, and the same final checkpoint (what --save-every writes does not
# change the training).
start = time.monotonic()
rare_ckpt = os.path.join(tmp, "rare.safetensors")
subprocess.run([mixtrain, *flags, "--save-every", "25", "--save", rare_ckpt], env=env, check=True,
               stdout=subprocess.DEVNULL)
seconds = {"4": full_seconds, "25": time.monotonic() - start}
if read_safetensors(rare_ckpt)[0] != full_tensors:
    failures.append("the run saving every 25 steps ends with other tensors than the one saving every 4")
print(f"uninterrupted: {steps} steps in {seconds['4']:.2f} s saving every 4 steps, {seconds['25']:.2f} s every 25")


finished_first = 0
# Signals that landed in the start-up, before `train` installed its handlers (loading libraries, reading the flags):
# the process then dies by the default action with nothing written, as any process not yet running would. Such a run
# is run again; more than 20 in the whole test is a failure (a handler that never takes over would look like this).
killed_in_start_up = 0


def stopped_run(args, sig, longest, what):
    """Runs args and sends sig at a random moment up to `longest` seconds, again (with a new moment) while the run
    finishes first; returns the step it stopped after, or None on a failure."""
    global finished_first, killed_in_start_up
    while True:
        p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            p.wait(timeout=rnd.uniform(0.02, longest))
            p.communicate()
            finished_first += 1
            longest *= 0.8
        except subprocess.TimeoutExpired:
            p.send_signal(sig)
            err = p.communicate(timeout=60)[1]
            if p.returncode == -sig and not err.strip() and not temp_files() and killed_in_start_up < 20:
                killed_in_start_up += 1
                continue
            if p.returncode != 0 or "stopping after" in err:
                break
            finished_first += 1  # it ended between the wait and the signal, which was then not sent
    want = 128 + sig
    if p.returncode != want:
        failures.append(f"{what}: exit {p.returncode}, expected {want} ({signal.Signals(sig).name}): {err.strip()}")
        return None
    # (A signal after the last step lets the run finish its report; it exits 128 + the signal all the same.)
    lines = [l for l in err.splitlines() if l.startswith("mixtrain train: stopped by")]
    complete = ", the last (the run is complete)" in "".join(lines)
    if len(lines) != 1 or signal.Signals(sig).name not in lines[0] or not (
            "checkpoint saved to" in lines[0] or (complete and "this run wrote no checkpoint" in lines[0])):
        failures.append(f"{what}: no line saying where the checkpoint is: {err.strip()!r}")
        return None
    if temp_files():
        failures.append(f"{what}: temporary files left: {temp_files()}")
    return int(lines[0].split("after step ")[1].split(";")[0].split(",")[0])


def check_same_as_full(ckpt, report, what):
    tensors, meta = read_safetensors(ckpt)
    differ = [n for n in full_tensors if tensors.get(n) != full_tensors[n]] + sorted(set(tensors) - set(full_tensors))
    if differ:
        failures.append(f"{what}: tensors differ from the uninterrupted run's: {differ[:5]}")
    for key in ("format", "epoch", "step", "seed", "config"):
        if meta.get(key) != full_meta.get(key):
            failures.append(f"{what}: metadata '{key}' {meta.get(key)!r} != {full_meta.get(key)!r}")
    if fit_state_without_timing(meta) != fit_state_without_timing(full_meta):
        failures.append(f"{what}: the saved fit state (history) differs from the uninterrupted run's")
    if without_timing(json.load(open(report))) != without_timing(full_report):
        failures.append(f"{what}: the JSON report differs from the uninterrupted run's")
    return not differ


# Trials: SIGTERM, SIGINT and SIGHUP (SIGTERM most), 1 or 2 stops, each at a random moment from 0.02 s (the
# handlers are installed within milliseconds of the start) to the run's end.
identical = 0
stops = []
sigs = [signal.SIGTERM] * max(trials - 2, 1) + [signal.SIGINT, signal.SIGHUP]
for t, sig in enumerate(sigs[:max(trials, 3)]):
    what = f"trial {t + 1} ({signal.Signals(sig).name})"
    ckpt, report = os.path.join(tmp, f"t{t}.safetensors"), os.path.join(tmp, f"t{t}.json")
    every = "4" if t % 2 == 0 else "25"
    args = [mixtrain, *flags, "--save-every", every, "--save", ckpt, "--json", report]
    trial_stops = []
    for k in range(1 + t % 3 // 2):
        resume = ["--resume", ckpt] if os.path.exists(ckpt) else []
        step = stopped_run(args + resume, sig, seconds[every], what)
        if step is None:
            break
        trial_stops.append(step)
    stops += trial_stops
    if failures:
        break
    finish = subprocess.run(args + (["--resume", ckpt] if os.path.exists(ckpt) else []), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if finish.returncode != 0:
        failures.append(f"{what}: the resumed run exited {finish.returncode}: {finish.stderr.strip()}")
        break
    identical += check_same_as_full(ckpt, report, what)
    print(f"{what}: {args[-5]} {args[-4]}, stopped after steps {trial_stops}, resumed to the end: identical "
          f"{not failures}", flush=True)
    if failures:
        break
print(f"{identical}/{len(sigs[:max(trials, 3)])} stopped and resumed runs bit-identical to the uninterrupted one; "
      f"{len(stops)} stops at steps {sorted(stops)} ({finished_first} runs finished before their signal and were "
      f"run again; {killed_in_start_up} signals landed in the start-up, before the handlers, and were sent again)")

# A signal the process was started with ignored stays ignored (`nohup` ignores SIGHUP): the run goes on to its end.
nohup_ckpt = os.path.join(tmp, "nohup.safetensors")
p = subprocess.Popen([mixtrain, *flags, "--save-every", "4", "--save", nohup_ckpt], env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                     preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
time.sleep(min(0.1, seconds["4"] / 4))
p.send_signal(signal.SIGHUP)
err = p.communicate(timeout=60)[1]
if p.returncode != 0 or "stopping" in err or read_safetensors(nohup_ckpt)[0] != full_tensors:
    failures.append(f"an ignored SIGHUP stopped the run (exit {p.returncode}): {err.strip()!r}")
else:
    print("SIGHUP ignored at the start (nohup): the run went on to its end")

# A second signal: a wide model makes each save long (a 50 MB checkpoint, fsynced); the first SIGTERM asks for
# the save, the second is sent as soon as a temporary file appears, so it lands inside a save. Saves follow each
# other closely (one every 8 short steps), and on a fast disk (a tmpfs /tmp) one takes only tens of milliseconds: so
# nothing slow stands between seeing the temporary file and the second signal, and trials go on, up to 8, until one
# has landed.
wide = ["train", "--data", data, "--hidden", "2048,2048", "--batch-size", "16", "--epochs", "2", "--seed", "3",
        "--save-every", "8"]
inside_save = 0
for t in range(8):
    if t >= 3 and inside_save > 0:
        break
    ckpt = os.path.join(tmp, f"wide{t}.safetensors")
    p = subprocess.Popen([mixtrain, *wide, "--save", ckpt], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    # After the first step save (step 8), so a complete checkpoint exists to be kept.
    deadline = time.monotonic() + 60
    while not os.path.exists(ckpt) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.002)
    time.sleep(rnd.uniform(0, 0.2))
    p.send_signal(signal.SIGTERM)
    while not temp_files() and p.poll() is None:
        time.sleep(0.0005)
    landed = bool(temp_files())
    # The checkpoint's inode as the second signal is sent: a save writes a new file and renames it over the
    # checkpoint (never writes it in place), so a save cut by the signal leaves this inode at the path, and one
    # that completed before the signal took effect leaves another.
    ino = os.stat(ckpt).st_ino if landed and os.path.exists(ckpt) else None
    sent = time.monotonic()
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    took = time.monotonic() - sent
    what = f"second signal {t + 1}"
    landed = landed and ino is not None and os.path.exists(ckpt) and os.stat(ckpt).st_ino == ino
    if landed and p.returncode == -signal.SIGTERM:
        inside_save += 1
    elif p.returncode not in (-signal.SIGTERM, 143):
        failures.append(f"{what}: exit {p.returncode}: {err.strip()}")
    if temp_files():
        failures.append(f"{what}: temporary files left: {temp_files()}")
    if p.returncode == -signal.SIGTERM:
        try:
            read_safetensors(ckpt)  # complete: every tensor matches its checksum
        except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
            failures.append(f"{what}: the checkpoint left is not complete: {e}")
    print(f"{what}: exit {p.returncode} {took:.3f} s after the second signal; it landed inside the save: {landed}")
    for f in os.listdir(tmp):
        if f.startswith("wide"):
            os.remove(os.path.join(tmp, f))
if inside_save == 0:
    failures.append("no second signal landed inside a save: the temporary file's removal was not exercised")

print(f"{time.monotonic() - start:.1f} s in all")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    print(f"files kept in {tmp}")
    sys.exit(1)
for f in os.listdir(tmp):
    os.remove(os.path.join(tmp, f))
os.rmdir(tmp)
print("ok")
