#!/usr/bin/env bash
# Installs what is needed, checks the source format, builds, and runs every
# test: unit tests, the same unit tests under ASan + UBSan, the integration
# tests (real binaries, real ZeroMQ, services started by the tests on
# 127.0.0.1), and the fuzz targets for a bounded time each.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
echo "== source format (.clang-format)"
bash scripts/format.sh --check
bash scripts/build.sh
echo "== unit + integration tests (build/)"
ctest --test-dir build --output-on-failure --timeout 600 -j 1
echo "== unit tests under ASan + UBSan (build-asan/)"
bash scripts/build.sh --sanitize
# Bounded: a test that hangs fails the run instead of stalling it.
for t in smockron_tests smockron_identify_tests; do
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout 900 ./build-asan/bin/$t --gtest_brief=1
done
# The HTTP/2 session code (callbacks into nghttp2, streams outliving their
# connection's turns) under ASan + UBSan, driven by real clients. A report
# is written to a file and fails the run even when the tests passed.
echo "== HTTP/2, gRPC, cost, budget, concurrency, override API, tier, shared-rate, Envoy, CURVE, DNS discovery, Redis Cluster and trace integration tests against the ASan + UBSan daemons (build-asan/)"
asan_reports=$(mktemp -d)
(cd integration && SMOCKRON_BIN_DIR="$PWD/../build-asan/bin" \
  ASAN_OPTIONS="detect_leaks=1:log_path=$asan_reports/asan" UBSAN_OPTIONS="print_stacktrace=1:log_path=$asan_reports/ubsan" \
  timeout 900 python3 -m unittest test_http2 test_http2_abuse test_h2_defects test_protocol_pairs test_grpc test_cost \
    test_budgets test_concurrency test_overrides_api test_tiers test_shares test_envoy test_curve test_discovery test_redis_cluster test_traces)
if compgen -G "$asan_reports/*" >/dev/null; then
  cat "$asan_reports"/*
  echo "sanitizer reports above" >&2
  exit 1
fi
rm -rf "$asan_reports"
echo "== the container image and the compose stack (podman, podman-compose)"
bash scripts/test-image.sh
echo "== the daemons as users build them: Release with GCC and with clang, warnings as errors"
bash scripts/build.sh --variants
# 18 targets x 10 s: about 3 minutes of fuzzing in all.
echo "== fuzz targets (build-fuzz/, clang libFuzzer + ASan + UBSan, ${FUZZ_SECONDS:-10}s each)"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
echo "== all tests passed"
