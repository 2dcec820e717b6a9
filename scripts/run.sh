#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job on 127.0.0.1:
# smockron-master with its in-memory store (config/smockron.toml, or the
# file given as $1). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
config="${1:-config/smockron.toml}"
./build/bin/smockron-master --check --config "$config"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
./build/bin/smockron-master --config "$config" & pids+=($!)
cat <<MSG

smockron-master is running (config: $config)
  accounting (gatekeepers publish here): tcp://127.0.0.1:10004
  control (DELAY_UNTIL published here):  tcp://127.0.0.1:10005
  admin: curl http://127.0.0.1:9105/status   curl http://127.0.0.1:9105/metrics
Ctrl-C to stop.
MSG
wait
