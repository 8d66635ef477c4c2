#!/usr/bin/env bash
# Gathers what mixtrain builds against into .gpu, for scripts/gpu-check.sh on a GPU machine whose image has the CUDA
# toolkit, CMake, ninja and PyTorch but none of these, and where nothing can be installed. Run it here (Debian 12,
# after scripts/setup.sh installed the packages), then send .gpu with the working tree (it is ignored by git; about
# 5 MiB: the run tool's carry, [".gpu"]); gpu-check.sh uses what it finds there.
#   GoogleTest (googletest): its source, .gpu/googletest, which gpu-check.sh builds there with that machine's
#     compiler (a static library built here by g++ 12 references this libstdc++'s symbols and fails to link where the
#     C++ runtime is older)
#   nlohmann JSON (nlohmann-json3-dev): headers and CMake package (header-only), .gpu/prefix
#   zlib (zlib1g-dev): zlib.h, zconf.h and the static library (C: no C++ runtime in it), .gpu/prefix
# The layout under the prefix is Debian's (lib/x86_64-linux-gnu, share/cmake): the packages' CMake files locate
# their headers and libraries relative to themselves. The static library is position-independent, as Debian builds
# it, so it links into the GPU machine's executables too.
#
#   bash scripts/gpu-carry.sh          then, on the GPU machine: bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
multiarch=x86_64-linux-gnu
lib=/usr/lib/$multiarch
needed=(/usr/src/googletest/CMakeLists.txt /usr/include/nlohmann/json.hpp /usr/include/zlib.h "$lib/libz.a"
        /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake)
for f in "${needed[@]}"; do
  [ -e "$f" ] || { echo "gpu-carry: $f is missing: run bash scripts/setup.sh first (it installs the packages)" >&2; exit 2; }
done

prefix=.gpu/prefix
rm -rf .gpu
mkdir -p "$prefix/include" "$prefix/lib/$multiarch" "$prefix/share/cmake"
# GoogleTest's source without its own tests, samples and docs (not built there).
cp -r /usr/src/googletest .gpu/googletest
rm -rf .gpu/googletest/googletest/test .gpu/googletest/googlemock/test .gpu/googletest/googletest/samples \
  .gpu/googletest/docs
cp -r /usr/include/nlohmann /usr/include/zlib.h /usr/include/zconf.h "$prefix/include/"
cp "$lib"/libz.a "$prefix/lib/$multiarch/"
cp -r /usr/share/cmake/nlohmann_json "$prefix/share/cmake/"
# .gpu is ignored by git (.gitignore), so never committed, and still sent to a device machine when a call carries it.
echo "gpu-carry: $(du -sh .gpu | cut -f1) in .gpu (GoogleTest's source, nlohmann JSON, zlib); carry .gpu to the GPU machine"
