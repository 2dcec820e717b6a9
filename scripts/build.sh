#!/usr/bin/env bash
# Configures and builds Smockron with Ninja + ccache, warnings as errors
# (SMOCKRON_WERROR=OFF in the environment to build despite them).
#   scripts/build.sh               release build in build/ (binaries in build/bin/)
#   scripts/build.sh --sanitize    ASan + UBSan build of the unit tests, the daemons and smockron-query
#                                  (the CURVE tests make their keys with it) in build-asan/
#   scripts/build.sh --clang       the daemons as packagers build them with clang: Release, warnings
#                                  as errors (build-clang/; the GCC Release build is the image's)
#   scripts/build.sh --ship        only what is shipped (the daemons and smockron-query), Release, in
#                                  build/ (the container image's build stage: no tests, fuzzers, benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hashes the paths under the checkout relative to it, and not the
# build directory, so a clone elsewhere (CI's clean clone) reuses what another
# clone compiled (debug info and __FILE__ may then name that clone's path).
# The physical path: CMake names files by it, whatever symbolic links $PWD has.
export CCACHE_BASEDIR="$(pwd -P)" CCACHE_NOHASHDIR=1
jobs="${SMOCKRON_JOBS:-2}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
launcher+=(-DSMOCKRON_WERROR="${SMOCKRON_WERROR:-ON}")
if [ "${1:-}" = "--clang" ]; then
  cmake -S . -B build-clang -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DSMOCKRON_BENCHMARKS=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
  cmake --build build-clang -j "$jobs" --target smockron-proxy smockron-master
elif [ "${1:-}" = "--ship" ]; then
  cmake -S . -B build -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DSMOCKRON_BENCHMARKS=OFF >/dev/null
  cmake --build build -j "$jobs" --target smockron-proxy smockron-master smockron-query
elif [ "${1:-}" = "--sanitize" ]; then
  cmake -S . -B build-asan -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DSMOCKRON_SANITIZE=ON \
    -DSMOCKRON_BENCHMARKS=OFF >/dev/null
  cmake --build build-asan -j "$jobs" --target smockron_tests smockron_identify_tests smockron-proxy smockron-master \
    smockron-query
else
  cmake -S . -B build -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j "$jobs"
fi
