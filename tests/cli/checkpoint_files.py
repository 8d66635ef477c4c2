"""What the checkpoint and resume tests of the command line share: their training data, a reader of the
safetensors checkpoints `mixtrain train --save` writes, and the parts of a run's results that must match bit for
bit between an uninterrupted run and a stopped, killed or resumed one."""
import json
import random
import struct
import zlib


def write_blobs_csv(path):
    """Three Gaussian blobs in 12 dimensions, 480 rows (24 steps of 16 rows per epoch after the test and
    validation splits), the same rows every time."""
    rng = random.Random(7)
    with open(path, "w") as f:
        f.write(",".join(f"f{j}" for j in range(12)) + ",label\n")
        for i in range(480):
            label = i % 3
            xs = [rng.gauss(0, 0.8) + (1.5 if j % 3 == label else 0.0) for j in range(12)]
            f.write(",".join(f"{v:.5f}" for v in xs) + f",{label}\n")


def read_safetensors(path):
    """(tensors: name -> (dtype, shape, bytes), metadata) of a safetensors file written by mixtrain: every tensor's
    CRC-32 must match the checksum written beside it (else ValueError), so a torn or mixed file never compares."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = blob[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
    for name, (_, _, raw) in tensors.items():
        if meta.get("checksum/" + name) != f"crc32:{zlib.crc32(raw):08x}":
            raise ValueError(f"{path}: tensor {name} does not match its checksum")
    return tensors, meta


def without_timing(report):
    """A --json report without what depends on the clock (and the allocator's peak, which a resumed run measures
    from its own start)."""
    r = dict(report)
    for k in ("steps_per_second", "samples_per_second", "peak_memory_bytes"):
        r.pop(k, None)
    r["epochs"] = [{k: v for k, v in e.items() if k != "seconds"} for e in r["epochs"]]
    return r


def fit_state_without_timing(meta):
    """The checkpoint's fit state (history, counters) without its clock readings."""
    state = json.loads(meta["fit_state"])
    state["history"].pop("epoch_seconds")
    state["history"].pop("train_seconds")
    return state
