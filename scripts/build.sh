#!/usr/bin/env bash
# Configures and builds Smockron with Ninja + ccache, warnings as errors
# (SMOCKRON_WERROR=OFF in the environment to build despite them).
#   scripts/build.sh               release build in build/ (binaries in build/bin/)
#   scripts/build.sh --sanitize    ASan + UBSan build of the unit tests in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${SMOCKRON_JOBS:-2}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
launcher+=(-DSMOCKRON_WERROR="${SMOCKRON_WERROR:-ON}")
if [ "${1:-}" = "--sanitize" ]; then
  cmake -S . -B build-asan -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DSMOCKRON_SANITIZE=ON \
    -DSMOCKRON_BENCHMARKS=OFF >/dev/null
  cmake --build build-asan -j "$jobs" --target smockron_tests smockron_identify_tests
else
  cmake -S . -B build -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j "$jobs"
fi
