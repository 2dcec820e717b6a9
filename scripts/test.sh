#!/usr/bin/env bash
# Installs what is needed, checks the source format, builds, and runs every
# test: unit tests, the same unit tests under ASan + UBSan, the integration
# tests (real binaries, real ZeroMQ, services started by the tests on
# 127.0.0.1), the container image and compose stack, and the fuzz targets for
# a bounded time each.
#
# The later builds run at the lowest CPU priority beside the earlier tests:
# the integration tests mostly wait on sockets (test_cluster: 24 s, 6 s of
# CPU), and every test passes beside two busy loops at normal priority. A
# build's output is shown when it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
echo "== source format (.clang-format)"
bash scripts/format.sh --check
bash scripts/build.sh

logs=$(mktemp -d)
declare -A builds=()  # name -> pid, which is also its process group's
# A failed test stops the run: the builds still going stop with it.
stop_builds() {
  for pid in "${builds[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap stop_builds EXIT
# Starts a build in the background at nice 19, in a process group of its own,
# its output in $logs/NAME.
background() {
  local name=$1
  shift
  nice -n 19 setsid -w "$@" > "$logs/$name" 2>&1 &
  builds[$name]=$!
}
# Waits for a background build; shows its output and stops the run if it failed.
finish() {
  local name=$1
  echo "== waiting for the $name build"
  wait "${builds[$name]}" || { cat "$logs/$name"; echo "the $name build failed" >&2; exit 1; }
  unset "builds[$name]"
}

background asan bash scripts/build.sh --sanitize
echo "== unit + integration tests (build/); ASan + UBSan build (build-asan/) beside them"
ctest --test-dir build --output-on-failure --timeout 600 -j 1
finish asan

# Beside the ASan tests: clang's Release build, the fuzz targets, the images.
background "clang, fuzz and image" bash -c \
  'bash scripts/build.sh --clang && bash scripts/fuzz.sh --build && bash scripts/test-image.sh --build'
echo "== unit tests under ASan + UBSan (build-asan/); clang Release, fuzz and image builds beside them"
# Bounded: a test that hangs fails the run instead of stalling it.
for t in smockron_tests smockron_identify_tests; do
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout 900 ./build-asan/bin/$t --gtest_brief=1
done
# The HTTP/2 session code (callbacks into nghttp2, streams outliving their
# connection's turns) under ASan + UBSan, driven by real clients. A report
# is written to a file and fails the run even when the tests passed.
echo "== HTTP/2, gRPC, cost, budget, concurrency, exact admission, pace share, override API, tier, shared-rate, Envoy, CURVE, DNS discovery, Redis Cluster and trace integration tests against the ASan + UBSan daemons (build-asan/)"
asan_reports=$(mktemp -d)
(cd integration && SMOCKRON_BIN_DIR="$PWD/../build-asan/bin" \
  ASAN_OPTIONS="detect_leaks=1:log_path=$asan_reports/asan" UBSAN_OPTIONS="print_stacktrace=1:log_path=$asan_reports/ubsan" \
  timeout 900 python3 -m unittest test_http2 test_http2_abuse test_h2_defects test_protocol_pairs test_grpc test_cost \
    test_budgets test_concurrency test_exact test_pace_share test_overrides_api test_tiers test_shares test_envoy test_curve test_discovery test_redis_cluster test_traces)
if compgen -G "$asan_reports/*" >/dev/null; then
  cat "$asan_reports"/*
  echo "sanitizer reports above" >&2
  exit 1
fi
rm -rf "$asan_reports"
finish "clang, fuzz and image"
grep -E "^built in" "$logs/clang, fuzz and image" || true

echo "== the container image (GCC Release, warnings as errors) and the compose stack (podman, podman-compose)"
bash scripts/test-image.sh
# 20 targets x 10 s, two at a time: under 2 minutes of fuzzing in all.
echo "== fuzz targets (build-fuzz/, clang libFuzzer + ASan + UBSan, ${FUZZ_SECONDS:-10}s each)"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
echo "== all tests passed"
