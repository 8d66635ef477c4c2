#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 1500 "$@"
