#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs the main job: the MLP on Fashion-MNIST.
# Extra arguments are passed to `mixtrain train` (e.g. --policy mixed_float16).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
./build/tools/cli/mixtrain train --model mlp --data fashion-mnist --epochs 5 --seed 1 --policy float32 \
  --json out/train.json "$@"
