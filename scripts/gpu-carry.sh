#!/usr/bin/env bash
# Gathers the C++ libraries mixtrain builds against into .gpu/prefix, for scripts/gpu-check.sh on a GPU machine whose
# image has the CUDA toolkit, CMake, ninja and PyTorch but none of these, and where nothing can be installed. Run it
# here (Debian 12, after scripts/setup.sh installed the packages), then send .gpu with the working tree (it is
# ignored by git; about 4 MiB); gpu-check.sh hands .gpu/prefix to CMake when it is there.
#   GoogleTest (libgtest-dev): headers, static libraries and CMake package, so the GPU tests build there
#   nlohmann JSON (nlohmann-json3-dev): headers and CMake package (header-only)
#   zlib (zlib1g-dev): zlib.h, zconf.h and the static library
# The layout under the prefix is Debian's (lib/x86_64-linux-gnu, share/cmake): the packages' CMake files locate
# their headers and libraries relative to themselves. The static libraries are position-independent, as Debian
# builds them, so they link into the GPU machine's executables too.
#
#   bash scripts/gpu-carry.sh          then, on the GPU machine: bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
multiarch=x86_64-linux-gnu
lib=/usr/lib/$multiarch
needed=(/usr/include/gtest/gtest.h /usr/include/nlohmann/json.hpp /usr/include/zlib.h
        "$lib/libgtest.a" "$lib/libgtest_main.a" "$lib/libz.a" "$lib/cmake/GTest/GTestConfig.cmake"
        /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake)
for f in "${needed[@]}"; do
  [ -e "$f" ] || { echo "gpu-carry: $f is missing: run bash scripts/setup.sh first (it installs the packages)" >&2; exit 2; }
done

prefix=.gpu/prefix
rm -rf .gpu
mkdir -p "$prefix/include" "$prefix/lib/$multiarch/cmake" "$prefix/share/cmake"
cp -r /usr/include/gtest /usr/include/gmock /usr/include/nlohmann /usr/include/zlib.h /usr/include/zconf.h \
  "$prefix/include/"
cp "$lib"/libgtest.a "$lib"/libgtest_main.a "$lib"/libgmock.a "$lib"/libgmock_main.a "$lib"/libz.a "$prefix/lib/$multiarch/"
cp -r "$lib/cmake/GTest" "$prefix/lib/$multiarch/cmake/"
cp -r /usr/share/cmake/nlohmann_json "$prefix/share/cmake/"
# Ignored by git (so never committed), and still sent to a device machine when a call carries it.
exclude=.git/info/exclude
if [ -d .git ] && ! grep -qx '/.gpu/' "$exclude" 2>/dev/null; then echo '/.gpu/' >> "$exclude"; fi
echo "gpu-carry: $(du -sh .gpu | cut -f1) in .gpu/prefix (GoogleTest, nlohmann JSON, zlib); carry .gpu to the GPU machine"
