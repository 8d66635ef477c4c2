#!/usr/bin/env bash
# Trains from a CSV file (header, numeric features, label last): standardised features, a held-out
# test split, and a --json report with the documented fields.
set -eu
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Two classes separated along the first feature, which has a large offset and scale (standardisation matters).
python3 - "$tmp/data.csv" <<'PY'
import random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    f.write("f1,f2,f3,label\n")
    for i in range(700):
        c = i % 2
        f.write(f"{1000 + 50 * (2 * c - 1) + random.gauss(0, 20):.3f},{random.gauss(0, 1):.3f},{random.random():.3f},{c}\n")
PY
"$bin" train --data "$tmp/data.csv" --epochs 3 --batch-size 16 --seed 2 --json "$tmp/r.json" >"$tmp/log"
cat "$tmp/log"
python3 - "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for k in ["model", "data", "policy", "seed", "epochs", "step_loss", "test", "steps_per_second", "samples_per_second", "peak_memory_bytes"]:
    assert k in r, k
assert len(r["epochs"]) == 3
for e in r["epochs"]:
    for k in ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "seconds"]:
        assert k in e, k
assert r["test"]["accuracy"] > 0.95, r["test"]
assert r["peak_memory_bytes"] > 0 and r["steps_per_second"] > 0
print("csv training ok: test accuracy", r["test"]["accuracy"])
PY
# Pure 16-bit policies (variables in float16 / bfloat16 too) also train.
for p in float16 bfloat16; do
  "$bin" train --data "$tmp/data.csv" --epochs 3 --batch-size 16 --seed 2 --policy "$p" --json "$tmp/$p.json" >/dev/null
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); a=r['test']['accuracy']; print(sys.argv[2], a); assert a > 0.95" "$tmp/$p.json" "$p"
done
