#!/usr/bin/env bash
# Installs every Debian 12 package Smockron needs to build, test and benchmark.
# Used by the README quick start, .ci/run and the Dockerfile alike.
#   scripts/install-deps.sh                    what building and running needs
#   scripts/install-deps.sh --test             and what the tests and benchmarks run
#   scripts/install-deps.sh --print-packages [--test]
#                                              prints those Debian packages, one a line, as a
#                                              fresh machine gets them (npm included), and
#                                              installs nothing (integration/test_install_deps.py)
set -euo pipefail
test_deps=0
print_only=0
for arg in "$@"; do
  case "$arg" in
    --test) test_deps=1 ;;
    --print-packages) print_only=1 ;;
  esac
done
packages=(
  build-essential cmake ninja-build ccache pkg-config git nlohmann-json3-dev
  libboost1.81-dev
  libzmq3-dev cppzmq-dev libsodium-dev libc-ares-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libssl-dev libhiredis-dev libnghttp2-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-zmq curl
)
if [ "$test_deps" = 1 ]; then
  # Services and tools started by the tests and benchmarks themselves.
  packages+=(redis-server redis-sentinel nginx-light wrk procps docker-compose)
  # callgrind, for the instructions-per-request benchmark (integration/bench/instructions.py).
  packages+=(valgrind)
  # Real HTTP clients that honour Retry-After (integration/test_retry_after.py).
  packages+=(python3-urllib3)
  # HTTP/2 and gRPC peers (integration/test_http2.py, test_grpc.py, bench/h2_bench.py).
  packages+=(nghttp2-client python3-h2 python3-grpcio python3-protobuf)
  # clang's libFuzzer for the fuzz targets (scripts/fuzz.sh).
  packages+=(clang libclang-rt-14-dev)
  # The source format check (scripts/format.sh --check).
  packages+=(clang-format)
  # The container image and the compose stack, built and run by
  # scripts/test-image.sh (podman with runc and netavark; the base image made
  # with debootstrap); promtool for deploy/'s alerting rules; headless
  # Chromium for the status pages; matplotlib for the benchmarks' plots.
  packages+=(podman podman-compose runc catatonit netavark aardvark-dns iptables debootstrap prometheus chromium python3-matplotlib)
  # npm for the Dockerfile linter below. Only when there is no npm at all: a
  # Node.js from elsewhere (e.g. NodeSource) ships its own npm, which Debian's
  # npm package would conflict with.
  if [ "$print_only" = 1 ] || ! command -v npm >/dev/null 2>&1; then packages+=(npm); fi
fi
if [ "$print_only" = 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

if [ "$test_deps" = 1 ]; then
  # Dockerfile linter (dockerfile-utils, used by integration/test_packaging.py),
  # pinned with its dependencies by scripts/dockerfile-lint/package-lock.json,
  # installed from the npm registry into build/tools/ (git-ignored; nothing
  # global changes). Skipped when build/tools/ already holds this lock.
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  lint_src="$root/scripts/dockerfile-lint"
  tools="$root/build/tools"
  if ! cmp -s "$lint_src/package-lock.json" "$tools/package-lock.json" \
     || [ ! -x "$tools/node_modules/.bin/dockerfile-utils" ]; then
    mkdir -p "$tools"
    cp "$lint_src/package.json" "$lint_src/package-lock.json" "$tools/"
    npm ci --prefix "$tools" --no-audit --no-fund --loglevel=error
  fi
  "$tools/node_modules/.bin/dockerfile-utils" --version
  # The Kubernetes object schemas (pinned by their lock file) that integration/test_kubernetes.py validates with.
  k8s="$tools/kubernetes"
  if ! cmp -s "$root/deploy/kubernetes/validate/package-lock.json" "$k8s/package-lock.json" ||
     [ ! -d "$k8s/node_modules/kubernetes-models" ]; then
    mkdir -p "$k8s"
    cp "$root/deploy/kubernetes/validate/package.json" "$root/deploy/kubernetes/validate/package-lock.json" "$k8s/"
    npm ci --prefix "$k8s" --no-audit --no-fund --loglevel=error
  fi
fi
