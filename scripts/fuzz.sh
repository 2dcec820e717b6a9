#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs
# each for SECONDS (default 60) on its seed corpus (tests/fuzz/corpus/), new
# inputs going to a temporary directory. A crash, a leak, a sanitizer report
# or a failed property stops the run with a non-zero exit; the input is left
# in build-fuzz/artifacts/ (add it to the target's corpus and as a unit test).
#   scripts/fuzz.sh                      every target, 60 s each
#   scripts/fuzz.sh 12                   every target, 12 s each (the test command)
#   scripts/fuzz.sh 600 fuzz_wire        one target for 10 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache hashes the paths under the checkout relative to it, and not the
# build directory, so a clone elsewhere (CI's clean clone) reuses what another
# clone compiled (debug info and __FILE__ may then name that clone's path).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
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
mkdir -p build-fuzz/artifacts
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  log="build-fuzz/$t.log"
  echo "== $t: ${seconds}s"
  if ! ./build-fuzz/bin/"$t" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    cat "$log"
    rm -rf "$work"
    echo "$t: FAILED (input in build-fuzz/artifacts/)"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$log" | tr '\n' ' '
  echo
  rm -rf "$work"
done
