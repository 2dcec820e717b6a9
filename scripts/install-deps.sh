#!/usr/bin/env bash
# Installs every Debian 12 package Smockron needs to build, test and benchmark.
# Used by the README quick start, .ci/run and the Dockerfile alike.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config git nlohmann-json3-dev
  libboost1.81-dev
  libzmq3-dev cppzmq-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libssl-dev libhiredis-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-zmq curl
)
if [ "${1:-}" = "--test" ]; then
  # Services and tools started by the tests and benchmarks themselves.
  packages+=(redis-server nginx-light wrk procps docker-compose)
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
