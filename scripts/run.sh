#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job on 127.0.0.1:
# smockron-master (in-memory store) + smockron-proxy in front of a demo
# backend, all on the shipped config/smockron.toml (or the file given as $1,
# in which case no demo backend is started). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
config="${1:-config/smockron.toml}"
./build/bin/smockron-master --check --config "$config"
./build/bin/smockron-proxy --check --config "$config"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
if [ -z "${1:-}" ]; then
  python3 scripts/demo_backend.py 9000 & pids+=($!)
fi
./build/bin/smockron-master --config "$config" & pids+=($!)
./build/bin/smockron-proxy --config "$config" & pids+=($!)
sleep 1
cat <<MSG

Smockron is running (config: $config)
  proxy:   http://127.0.0.1:8080/   (demo domain: 2/s, burst 5, per X-API-Key or client IP)
  try:     for i in \$(seq 12); do curl -s -o /dev/null -w '%{http_code} %{time_total}s\n' -H 'X-API-Key: alice' http://127.0.0.1:8080/; done
  metrics: curl -s http://127.0.0.1:9106/metrics | grep smockron_proxy_requests_total
  master:  curl -s http://127.0.0.1:9105/status
Ctrl-C to stop.
MSG
wait
