#!/usr/bin/env bash
# The MLP on Fashion-MNIST (the main job of earlier versions): `mixtrain compare`, float32 / mixed_float16 / mixed_bfloat16,
# 5 epochs, seed 1. Checks the acceptance figures, that one seed gives identical results, and that the
# report.html renders its loss curves in headless Chromium.
set -eu
bin="$1"
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"; exit 1
fi
"$bin" train --model mlp --data fashion-mnist --epochs 1 --batch-size 256 --seed 4 --json "$tmp/a.json" >/dev/null
"$bin" train --model mlp --data fashion-mnist --epochs 1 --batch-size 256 --seed 4 --json "$tmp/b.json" >/dev/null
"$bin" compare --model mlp --data fashion-mnist --epochs 5 --seed 1 \
  --policies float32,mixed_float16,mixed_bfloat16 --out "$tmp/compare" | grep -vE "^(Layer|dense|Total|Trainable|Non-|Model|_|=)"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
a, b = json.load(open(d + "/a.json")), json.load(open(d + "/b.json"))
strip = lambda r: [{k: v for k, v in e.items() if k != "seconds"} for e in r["epochs"]]
assert strip(a) == strip(b), (strip(a), strip(b))
assert a["test"] == b["test"] and a["step_loss"] == b["step_loss"]
print("same seed, same results: ok")
rep = json.load(open(d + "/compare/report.json"))
runs = rep["policies"]
f32 = runs["float32"]
acc32 = f32["test"]["accuracy"]
print(f"float32 test accuracy {acc32:.4f}")
assert acc32 >= 0.87, acc32
for p in ["mixed_float16", "mixed_bfloat16"]:
    r = runs[p]
    acc = r["test"]["accuracy"]
    devs = [abs(e["loss"] - e32["loss"]) / e32["loss"] for e, e32 in zip(r["epochs"], f32["epochs"])]
    print(f"{p}: test accuracy {acc:.4f} ({100 * (acc - acc32):+.2f} points), "
          f"max epoch-loss deviation {100 * max(devs):.2f}%, verdict {r['verdict']}")
    assert abs(acc - acc32) <= 0.005, (p, acc, acc32)
    assert max(devs) <= 0.03, (p, devs)
    for k in ["verdict", "speedup", "memory_ratio", "max_loss_deviation", "epochs", "step_loss", "test"]:
        assert k in r, (p, k)
assert "loss_scale" in runs["mixed_float16"]
PY
for f in report.json steps.csv report.html; do [ -s "$tmp/compare/$f" ] || { echo "missing $f"; exit 1; }; done

render_report "$tmp/compare/report.html" "$tmp/dom.html" "$tmp"
expect_curves "$tmp/dom.html" 1 float32 mixed_float16 mixed_bfloat16
