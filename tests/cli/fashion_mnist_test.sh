#!/usr/bin/env bash
# The acceptance run: the MLP on Fashion-MNIST, float32, 5 epochs, seed 1, reaches >= 0.87 test accuracy.
# A second, shorter run pair checks that one seed gives identical epochs and test values.
set -eu
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"; exit 1
fi
"$bin" train --model mlp --data fashion-mnist --epochs 1 --batch-size 256 --seed 4 --json "$tmp/a.json" >/dev/null
"$bin" train --model mlp --data fashion-mnist --epochs 1 --batch-size 256 --seed 4 --json "$tmp/b.json" >/dev/null
"$bin" train --model mlp --data fashion-mnist --epochs 5 --seed 1 --policy float32 --json "$tmp/full.json"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
a, b = json.load(open(d + "/a.json")), json.load(open(d + "/b.json"))
strip = lambda r: [{k: v for k, v in e.items() if k != "seconds"} for e in r["epochs"]]
assert strip(a) == strip(b), (strip(a), strip(b))
assert a["test"] == b["test"] and a["step_loss"] == b["step_loss"]
full = json.load(open(d + "/full.json"))
acc = full["test"]["accuracy"]
print("same seed, same results: ok; 5-epoch test accuracy", acc)
assert acc >= 0.87, acc
PY
