#!/usr/bin/env bash
# Installs mixtrain into a temporary prefix, moves that prefix elsewhere (as a package copied to another machine
# would be), then builds and runs examples/consumer against it with find_package. The installed CMake files must
# name no path of the build machine: not the build or source tree, not the first prefix, not the CUDA toolkit.
set -eu
build_dir="$1"
src_dir="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
mv "$tmp/prefix" "$tmp/moved"
# $3, when the CUDA backend is built: the toolkit's library folder, checked as given and with links resolved.
cuda_dirs=()
if [ -n "${3:-}" ]; then cuda_dirs=("$3" "$(readlink -f "$3")"); fi
for path in "$tmp/prefix" "$(cd "$build_dir" && pwd)" "$(cd "$src_dir" && pwd)" ${cuda_dirs[@]+"${cuda_dirs[@]}"}; do
  if grep -rlF "$path" "$tmp/moved/lib"*/cmake/mixtrain >/dev/null; then
    echo "FAIL: the installed CMake package names $path:" >&2
    grep -rnF "$path" "$tmp/moved/lib"*/cmake/mixtrain >&2
    exit 1
  fi
done
# And no library named by an absolute path (the build machine's, wherever it is): the package's own are relative
# to ${_IMPORT_PREFIX}, the others are imported targets or plain names.
if grep -nE 'INTERFACE_LINK_LIBRARIES ".*(^|[";])/' "$tmp/moved/lib"*/cmake/mixtrain/mixtrainTargets*.cmake >&2; then
  echo "FAIL: the installed CMake package links a library by an absolute path (above)" >&2
  exit 1
fi
cmake -S "$src_dir/examples/consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/moved" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
