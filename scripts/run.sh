#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job on 127.0.0.1:
# smockron-master (in-memory store) + smockron-proxy in front of a demo
# backend, all on the embedded defaults (config/smockron.toml, compiled into
# both binaries), or on the file given as $1, in which case no demo backend is
# started. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
args=()
config="embedded defaults (config/smockron.toml)"
if [ -n "${1:-}" ]; then
  config="$1"
  args=(--config "$1")
fi
./build/bin/smockron-master --check "${args[@]}"
./build/bin/smockron-proxy --check "${args[@]}"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
if [ -z "${1:-}" ]; then
  python3 scripts/demo_backend.py 9000 & pids+=($!)
fi
./build/bin/smockron-master "${args[@]}" & pids+=($!)
./build/bin/smockron-proxy "${args[@]}" & pids+=($!)
# Ready when both admin endpoints answer (bounded: 10 s).
for _ in $(seq 100); do
  curl -fs -o /dev/null http://127.0.0.1:9105/readyz && curl -fs -o /dev/null http://127.0.0.1:9106/readyz && break
  sleep 0.1
done
cat <<MSG

Smockron is running (config: $config)
  proxy:   http://127.0.0.1:8080/   (demo domain: 2/s, burst 5, per X-API-Key or client IP)
  accepted, then delayed (held, one every 500 ms):
           for i in \$(seq 12); do curl -s -o /dev/null -w '%{http_code} %{time_total}s\n' -H 'X-API-Key: alice' http://127.0.0.1:8080/; done
  rejected (503 + Retry-After once a wait would exceed max_delay = 5s):
           seq 30 | xargs -P30 -I{} curl -s -o /dev/null -w '%{http_code} retry-after=%header{retry-after}\n' -H 'X-API-Key: bob' http://127.0.0.1:8080/
  metrics: curl -s http://127.0.0.1:9106/metrics | grep smockron_proxy_requests_total
  master:  curl -s http://127.0.0.1:9105/status
Ctrl-C to stop.
MSG
wait
