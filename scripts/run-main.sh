#!/usr/bin/env bash
# Sets up and builds the command-line tool (scripts/setup.sh; the tests and benchmarks are built by
# scripts/test.sh), then runs the main job: the transformer character language model on
# Moby Dick (installed by the setup) trained for 1,000 steps under float32, mixed_float16 and mixed_bfloat16
# with one seed, each compared with the float32 baseline.
# Writes out/compare/report.json, out/compare/steps.csv and out/compare/report.html.
# Extra arguments go to `mixtrain compare` (e.g. --steps 2000 --recover).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh mixtrain_cli
./build/tools/cli/mixtrain compare --model transformer --data moby-dick --seed 1 \
  --policies float32,mixed_float16,mixed_bfloat16 --out out/compare "$@"
