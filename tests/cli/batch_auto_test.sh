#!/usr/bin/env bash
# --batch-size auto --memory-budget: the chosen batch's run stays within the budget, and mixed_float16
# (16-bit activations) gets a larger batch than float32 under the same budget.
set -eu
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in float32 mixed_float16; do
  "$bin" train --data fashion-mnist --epochs 1 --batch-size auto --memory-budget 48M --policy "$p" \
    --json "$tmp/$p.json" | grep "batch size auto"
done
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
f32, f16 = json.load(open(d + "/float32.json")), json.load(open(d + "/mixed_float16.json"))
budget = 48 * 2**20
for r in (f32, f16):
    assert r["peak_memory_bytes"] <= budget, (r["policy"], r["peak_memory_bytes"], budget)
ratio = f16["batch_size"] / f32["batch_size"]
print(f"batch under 48 MiB: float32 {f32['batch_size']}, mixed_float16 {f16['batch_size']} ({ratio:.2f}x)")
assert ratio >= 1.4, ratio
PY
# The transformer too (its trial steps were fed rows of floats: "this data has samples of 16 features", always):
# windows of ids with a target per position, and the run stays within the budget.
python3 -c "import sys; open(sys.argv[1], 'w').write('the quick brown fox jumps over the lazy dog. ' * 200)" "$tmp/fox.txt"
"$bin" train --data "text:$tmp/fox.txt" --model transformer --context 32 --steps 2 --batch-size auto \
  --memory-budget 64M --json "$tmp/lm.json" | grep "batch size auto"
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print('transformer batch', r['batch_size']); \
assert r['peak_memory_bytes'] <= 64 * 2**20 and r['batch_size'] >= 1, r" "$tmp/lm.json"
"$bin" train --batch-size auto --memory-budget lots >/dev/null 2>&1 && { echo "bad --memory-budget accepted"; exit 1; }
"$bin" train --memory-budget 1G >/dev/null 2>&1 && { echo "--memory-budget without auto accepted"; exit 1; }
echo ok
