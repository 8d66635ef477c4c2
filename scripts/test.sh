#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs every test through ctest (arguments go to that ctest).
# In CI (the CI variable set, as .ci/run's callers do) it then runs the unit tests of the layers that read files
# and the command line under AddressSanitizer + UndefinedBehaviorSanitizer (scripts/sanitize.sh) and every fuzz
# target for a bounded time (scripts/fuzz.sh). MIXTRAIN_TEST_SANITIZE=0|1 and MIXTRAIN_TEST_FUZZ=0|1 choose
# either outside or inside CI; MIXTRAIN_FUZZ_SECONDS sets the seconds per fuzz target (default 45).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 1500 "$@")

in_ci=0
[ -n "${CI:-}" ] && [ "${CI}" != "false" ] && [ "${CI}" != "0" ] && in_ci=1

if [ "${MIXTRAIN_TEST_SANITIZE:-$in_ci}" = 1 ]; then
  # Every GoogleTest suite (named Suite.Test) of the layers hostile input reaches (core, data, io, train with its
  # checkpoints, the kill test) and the CLI's bad-input script; the numeric suites and the end-to-end trainings
  # would multiply the CI's time under the sanitizers. `bash scripts/sanitize.sh` runs everything.
  bash scripts/sanitize.sh \
    --targets "core_test data_test io_test train_test checkpoint_kill_test mixtrain_cli" \
    -R '^([A-Z][A-Za-z0-9_]*\.|cli\.bad_input$)'
fi
if [ "${MIXTRAIN_TEST_FUZZ:-$in_ci}" = 1 ]; then
  bash scripts/fuzz.sh --seconds "${MIXTRAIN_FUZZ_SECONDS:-45}"
fi
