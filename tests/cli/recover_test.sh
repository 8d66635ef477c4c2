#!/usr/bin/env bash
# Raw, unnormalised CSV features of magnitude ~1e5 (--normalize none) overflow float16 in the first Dense.
# Under mixed_float16 with --recover training finishes, only the layers that need it run in float32, and
# test accuracy is within 1 point of float32's. Also: --save / --resume continue bit-identically, a recovered run
# included.
set -eu
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/raw.csv" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    f.write(",".join(f"f{j}" for j in range(6)) + ",label\n")
    for i in range(2100):
        c = i % 3
        f.write(",".join(f"{1e5 * (1 + 0.2 * random.gauss(0, 1) + (0.6 if j % 3 == c else 0)):.1f}" for j in range(6)))
        f.write(f",{c}\n")
PY
common=(--data "$tmp/raw.csv" --normalize none --epochs 4 --batch-size 32 --seed 3 --hidden 32,32)
"$bin" train "${common[@]}" --policy float32 --json "$tmp/f32.json" >/dev/null
"$bin" train "${common[@]}" --policy mixed_float16 --recover --json "$tmp/rec.json" | grep -E "recovery|test:"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
f32, rec = json.load(open(d + "/f32.json")), json.load(open(d + "/rec.json"))
acts = [e["action"] for e in rec["recovery"]]
print("recovery actions:", acts, "layers:", rec["layer_compute_dtypes"])
assert "layers_to_float32" in acts and "model_to_float32" not in acts and "give_up" not in acts, acts
dtypes = rec["layer_compute_dtypes"]
first = list(dtypes)[0]
assert dtypes[first] == "float32", dtypes
assert len(rec["epochs"]) == 4 and all(e["loss"] is not None for e in rec["epochs"])
a32, arec = f32["test"]["accuracy"], rec["test"]["accuracy"]
print(f"test accuracy: float32 {a32:.4f}, mixed_float16 --recover {arec:.4f}")
assert a32 > 0.9 and abs(a32 - arec) <= 0.01, (a32, arec)
PY

# A recovered run saved after 2 epochs and resumed to 4 keeps what the ladder did: the float32 layers and the
# record of actions are in the checkpoint, and the resumed run ends as the uninterrupted one (rec.json).
rec=(--data "$tmp/raw.csv" --normalize none --batch-size 32 --seed 3 --hidden 32,32 --policy mixed_float16 --recover)
"$bin" train "${rec[@]}" --epochs 2 --save "$tmp/rec.ckpt" >/dev/null
"$bin" train "${rec[@]}" --epochs 4 --resume "$tmp/rec.ckpt" --json "$tmp/rec_resumed.json" | grep resumed
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
full, res = json.load(open(d + "/rec.json")), json.load(open(d + "/rec_resumed.json"))
strip = lambda es: [{k: v for k, v in e.items() if k != "seconds"} for e in es]
assert res["layer_compute_dtypes"] == full["layer_compute_dtypes"], (res["layer_compute_dtypes"], full["layer_compute_dtypes"])
assert res["recovery"] == full["recovery"], (res["recovery"], full["recovery"])
assert strip(full["epochs"]) == strip(res["epochs"]), (full["epochs"], res["epochs"])
assert full["step_loss"] == res["step_loss"] and full["test"] == res["test"], (full["test"], res["test"])
print("a recovered run resumed from epoch 2 matches the uninterrupted one:", [e["action"] for e in res["recovery"]])
PY

# Resume: 2 epochs saved, then resumed to 4, equals 4 uninterrupted epochs; the checkpoint carries the history,
# so the resumed report holds all 4 epochs and every step.
norm=(--data "$tmp/raw.csv" --batch-size 64 --seed 7 --policy mixed_float16 --hidden 16)
"$bin" train "${norm[@]}" --epochs 4 --json "$tmp/full.json" >/dev/null
"$bin" train "${norm[@]}" --epochs 2 --save "$tmp/ckpt.safetensors" >/dev/null
"$bin" train "${norm[@]}" --epochs 4 --resume "$tmp/ckpt.safetensors" --json "$tmp/resumed.json" | grep resumed
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
full, res = json.load(open(d + "/full.json")), json.load(open(d + "/resumed.json"))
strip = lambda es: [{k: v for k, v in e.items() if k != "seconds"} for e in es]
assert strip(full["epochs"]) == strip(res["epochs"]), (full["epochs"], res["epochs"])
assert full["step_loss"] == res["step_loss"] and full["step_loss_scale"] == res["step_loss_scale"]
assert full["test"] == res["test"], (full["test"], res["test"])
assert full["loss_scale"]["final"] == res["loss_scale"]["final"]
print("resume from epoch 2 matches the uninterrupted run:", res["test"])
PY

# compare --recover: float32 runs first; the mixed run recovers and the report says what was done.
"$bin" compare "${common[@]}" --policies float32,mixed_float16 --recover --out "$tmp/cmp" >/dev/null
python3 - "$tmp/cmp/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mixed = r["policies"]["mixed_float16"]
acts = [e["action"] for e in mixed["recovery"]]
assert "layers_to_float32" in acts, acts
assert r["policies"]["float32"]["recovery"] == []
notes = r["comparison"].get("notes", [])
assert any("recovery" in n for n in notes), notes
print("compare --recover:", acts, "verdict", mixed["verdict"], "accuracy delta", mixed["accuracy_delta"])
PY

# A short run (12 steps) gets the ladder too: its checks are scaled to the run's length and stated in the log and
# the --json report (the fixed 20-step patience left a run this short failing with no action).
"$bin" train --data "$tmp/raw.csv" --normalize none --steps 12 --batch-size 32 --seed 3 --hidden 32,32 \
  --policy mixed_float16 --recover --json "$tmp/short.json" | grep "recovery: the drift check"
python3 - "$tmp/short.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
acts = [e["action"] for e in r["recovery"]]
assert "layers_to_float32" in acts, acts
assert r["recovery_timing"].endswith("a rung is climbed after 5 failed or drifting steps in a row"), r["recovery_timing"]
print("a 12-step run recovers:", acts)
PY
