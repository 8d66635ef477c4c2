#!/usr/bin/env bash
# The README's main job (scripts/run-main.sh): `mixtrain compare` of the transformer language model on Moby
# Dick under float32, mixed_float16 and mixed_bfloat16, 1,000 steps, seed 1. Checks the acceptance figures
# (float32 validation loss at most 1.9 nats per character, each mixed policy within 2% of it, no step skipped
# by the loss scaler after the first 300) and that report.html renders its curves in headless Chromium.
set -eu
bin="$1"
. "$(dirname "$0")/lib.sh"
require_moby_dick
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
"$bin" compare --model transformer --data moby-dick --seed 1 \
  --policies float32,mixed_float16,mixed_bfloat16 --out "$tmp/compare" | grep -E "^(===|validation|speed|loss scale|data)"
echo "main job took $(( $(date +%s) - start )) s"
python3 - "$tmp/compare/report.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
runs = rep["policies"]
f32 = runs["float32"]["test"]["loss"]
print(f"float32 validation loss {f32:.4f} nats per character")
assert f32 <= 1.9, f32
for p in ("mixed_float16", "mixed_bfloat16"):
    r = runs[p]
    v = r["test"]["loss"]
    print(f"{p}: validation loss {v:.4f} ({100 * (v - f32) / f32:+.2f}%), verdict {r['verdict']}, "
          f"speedup {r['speedup']}, memory ratio {r['memory_ratio']}")
    assert abs(v - f32) / f32 <= 0.02, (p, v, f32)
    # "no speedup" also means it tracks (on a CPU without 16-bit arithmetic, or a loaded one).
    assert r["verdict"] in ("tracks", "no speedup"), (p, r["verdict"], r.get("verdict_reason"))
scales = runs["mixed_float16"]["step_loss_scale"]
late_skips = [i + 1 for i in range(300, len(scales)) if scales[i] < scales[i - 1]]
assert not late_skips, f"steps skipped after step 300: {late_skips}"
print("mixed_float16: skipped steps", runs["mixed_float16"]["loss_scale"]["skipped_steps"], "(none after step 300)")
PY
for f in report.json steps.csv report.html; do [ -s "$tmp/compare/$f" ] || { echo "missing $f"; exit 1; }; done

render_report "$tmp/compare/report.html" "$tmp/dom.html" "$tmp"
expect_curves "$tmp/dom.html" 1 float32 mixed_float16 mixed_bfloat16
