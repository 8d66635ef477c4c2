#!/usr/bin/env bash
# Builds mixtrain with clang under AddressSanitizer + UndefinedBehaviorSanitizer (MIXTRAIN_SANITIZE) and runs the
# tests through ctest with every report fatal (halt_on_error) and leak checking on. The build directory is shared
# with scripts/fuzz.sh (the same configuration also builds the fuzz targets), so one compile serves both.
#
#   bash scripts/sanitize.sh                       # every test (slow: the end-to-end trainings take minutes)
#   bash scripts/sanitize.sh -R '^(Idx|Csv)\.'     # arguments after the options go to ctest
#
# Options: --build-dir DIR (default build-sanitize), --targets "a b" (what to build; default everything),
# --configure-only (configure, build nothing, run nothing: used by scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-sanitize targets="" configure_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --configure-only) configure_only=1; shift ;;
    *) break ;;
  esac
done

# clang and its sanitizer and libFuzzer runtimes come with scripts/setup.sh; clang's OpenMP runtime does not (g++
# uses libgomp), so it is installed here the same way when missing.
missing=()
for p in clang libclang-rt-14-dev libomp-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "sanitize.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Release optimisation (what users run, and fast enough to fuzz) with line tables, so reports name file:line.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-gline-tables-only" -DMIXTRAIN_SANITIZE=ON -DMIXTRAIN_FUZZ=ON -DMIXTRAIN_BENCH=OFF >/dev/null
[ "$configure_only" = 0 ] || exit 0

# shellcheck disable=SC2086  # targets is a list of names
ninja -C "$build_dir" -j "$(nproc)" $targets

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 1500 "$@"
