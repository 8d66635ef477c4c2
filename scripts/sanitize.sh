#!/usr/bin/env bash
# Builds mixtrain and its tests under AddressSanitizer + UndefinedBehaviorSanitizer (clang, -O1: the build that
# scripts/fuzz.sh shares, configured by scripts/sanitizer_build.sh) and runs them through ctest with every report
# fatal (halt_on_error) and leak checking on (detect_leaks=1). Arguments after the options go to ctest.
#
#   bash scripts/sanitize.sh                              # every test (slow: end-to-end trainings take minutes)
#   bash scripts/sanitize.sh -R '^(Idx|Csv|Safetensors)\.'  # a subset
#
# Options: --build-dir DIR (default build-sanitize), --targets "a b" (what to build; default everything).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-sanitize targets=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    *) break ;;
  esac
done

. scripts/sanitizer_build.sh
configure_sanitizer_build "$build_dir"
# shellcheck disable=SC2086  # targets is a list of names
ninja -C "$build_dir" -j "$(nproc)" $targets

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 1500 "$@"
