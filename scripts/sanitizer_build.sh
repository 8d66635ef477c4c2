#!/usr/bin/env bash
# The one build that scripts/sanitize.sh and scripts/fuzz.sh share (sourced by both, not run): clang with
# AddressSanitizer + UndefinedBehaviorSanitizer, the libFuzzer targets beside the GoogleTest binaries, so the library
# is compiled once for both (about 4 minutes of a 2-core CI machine's time; clang also compiles the sanitized code
# 1.45x faster than g++: 13.0 s against 18.8 s for tests/train/checkpoint_test.cpp). -O1 with NDEBUG (Release's
# assertions setting) and line tables, so reports name file:line. No benchmarks: they are not tests. No CUDA
# backend: nvcc's host compiler is g++, and the CUDA runtime and AddressSanitizer do not share an address space
# without extra options; the main build compiles it.
#
#   configure_sanitizer_build DIR     # installs what is missing, then configures DIR (the same flags every time,
#                                     # so the second script's configure changes nothing and rebuilds nothing)

configure_sanitizer_build() {
  local build_dir=$1 missing=() p
  # clang and its sanitizer and libFuzzer runtimes come with scripts/setup.sh; clang's OpenMP runtime does not
  # (g++ uses libgomp), so it is installed here the same way when missing.
  for p in clang libclang-rt-14-dev libomp-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "sanitizer build: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS="-gline-tables-only" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DMIXTRAIN_SANITIZE=ON \
    -DMIXTRAIN_FUZZ=ON -DMIXTRAIN_BENCH=OFF -DMIXTRAIN_CUDA=OFF >/dev/null
}
