#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs
# each for SECONDS (default 60) on its seed corpus (tests/fuzz/corpus/), new
# inputs going to a temporary directory, SMOCKRON_FUZZ_JOBS targets at a time
# (default 2: one core each). A crash, a leak, a sanitizer report or a failed
# property stops the run with a non-zero exit; the input is left in
# build-fuzz/artifacts/ (add it to the target's corpus and as a unit test).
#   scripts/fuzz.sh                      every target, 60 s each
#   scripts/fuzz.sh 12                   every target, 12 s each (the test command)
#   scripts/fuzz.sh 600 fuzz_wire        one target for 10 minutes
#   scripts/fuzz.sh --build              build every target, run none
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hashes the paths under the checkout relative to it, and not the
# build directory, so a clone elsewhere (CI's clean clone) reuses what another
# clone compiled (debug info and __FILE__ may then name that clone's path).
# The physical path: CMake names files by it, whatever symbolic links $PWD has.
export CCACHE_BASEDIR="$(pwd -P)" CCACHE_NOHASHDIR=1
build_only=false
if [ "${1:-}" = "--build" ]; then
  build_only=true
  shift
fi
seconds="${1:-60}"
shift || true
targets=(fuzz_wire fuzz_units fuzz_config fuzz_zmtp fuzz_zmtp_session fuzz_zmtp_curve fuzz_dns_answer fuzz_traceparent fuzz_http1_request fuzz_http1_response fuzz_http1_chunked fuzz_path
  fuzz_proxy_protocol fuzz_forwarded fuzz_identify fuzz_query fuzz_h2_fields fuzz_cost fuzz_h2_session fuzz_envoy)
[ $# -gt 0 ] && targets=("$@")
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-fuzz -G Ninja "${launcher[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSMOCKRON_FUZZ=ON >/dev/null
cmake --build build-fuzz -j "${SMOCKRON_JOBS:-2}" --target "${targets[@]}"
$build_only && exit 0
mkdir -p build-fuzz/artifacts
work=$(mktemp -d)
# On a finding, the targets still running stop with the run (set -e: kill's
# own failure, when none is left, must not decide the exit status).
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# One target, its log in build-fuzz/TARGET.log; exits non-zero on a finding.
# Run in the background, it becomes the fuzzer (exec), so the exit trap's
# kill reaches the fuzzer itself.
fuzz_one() {
  local t=$1
  mkdir -p "$work/$t"
  exec ./build-fuzz/bin/"$t" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$work/$t" "tests/fuzz/corpus/$t" \
    >"build-fuzz/$t.log" 2>&1
}

# Waits for the next target to end; prints its figures, or its log and stops
# the run on a finding.
declare -A running=()  # pid -> target
reap() {
  local pid rc=0
  wait -n -p pid "${!running[@]}" || rc=$?
  local t=${running[$pid]}
  unset "running[$pid]"
  if [ "$rc" -ne 0 ]; then
    cat "build-fuzz/$t.log"
    echo "$t: FAILED (input in build-fuzz/artifacts/)"
    exit 1
  fi
  echo "== $t: ${seconds}s $(grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "build-fuzz/$t.log" | tr '\n' ' ')"
}

for t in "${targets[@]}"; do
  fuzz_one "$t" &
  running[$!]=$t
  if [ "${#running[@]}" -ge "${SMOCKRON_FUZZ_JOBS:-2}" ]; then reap; fi
done
while [ "${#running[@]}" -gt 0 ]; do reap; done
