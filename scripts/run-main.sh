#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs the main job: the MLP on Fashion-MNIST trained under
# float32, mixed_float16 and mixed_bfloat16 with one seed, compared with the float32 baseline.
# Writes out/compare/report.json, out/compare/steps.csv and out/compare/report.html.
# Extra arguments go to `mixtrain compare` (e.g. --epochs 10 --recover).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/tools/cli/mixtrain compare --model mlp --data fashion-mnist --epochs 5 --seed 1 \
  --policies float32,mixed_float16,mixed_bfloat16 --out out/compare "$@"
