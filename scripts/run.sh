#!/usr/bin/env bash
# Installs what is needed, builds, and runs the main job on 127.0.0.1:
# smockron-master (in-memory store) + smockron-proxy in front of a demo
# backend, all on the embedded defaults (config/smockron.toml, compiled into
# both binaries), or on the file given as $1, in which case no demo backend is
# started. Ctrl-C stops everything; so does any of them exiting (the script
# then exits non-zero and says which). A daemon that does not come up within
# 10 s is an error, never "running".
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SMOCKRON_SKIP_BUILD:-}" ]; then  # set by the test of this script, which has built already
  bash scripts/install-deps.sh
  bash scripts/build.sh
fi
bin=${SMOCKRON_BIN_DIR:-./build/bin}
args=()
config="embedded defaults (config/smockron.toml)"
if [ -n "${1:-}" ]; then
  config="$1"
  args=(--config "$1")
fi
"$bin"/smockron-master --check "${args[@]}"
"$bin"/smockron-proxy --check "${args[@]}"

declare -A names=()
cleanup() {
  trap - EXIT INT TERM
  local p
  for p in "${!names[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # Daemons drain within their grace period; whatever is left after 15 s is killed.
  for _ in $(seq 150); do
    local alive=0
    for p in "${!names[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${!names[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'echo; echo "stopping"; exit 130' INT TERM
start() {  # start NAME COMMAND...
  local name=$1
  shift
  "$@" &
  names[$!]=$name
}

if [ -z "${1:-}" ]; then
  start "demo backend (127.0.0.1:9000)" python3 scripts/demo_backend.py 9000
fi
start smockron-master "$bin"/smockron-master "${args[@]}"
start smockron-proxy "$bin"/smockron-proxy "${args[@]}"

# Exits (through cleanup) naming every process that is no longer running.
gone() {
  local p dead=""
  for p in "${!names[@]}"; do kill -0 "$p" 2>/dev/null || dead+="${dead:+, }${names[$p]}"; done
  if [ -n "$dead" ]; then
    echo "smockron: $dead exited: $1 (see its log above)" >&2
    exit 1
  fi
}

# Ready when both admin endpoints answer (bounded: 10 s), and nothing exited meanwhile.
ready=0
for _ in $(seq 100); do
  gone "not running"
  if curl -fs -o /dev/null http://127.0.0.1:9105/readyz && curl -fs -o /dev/null http://127.0.0.1:9106/readyz; then
    ready=1
    break
  fi
  sleep 0.1
done
if [ "$ready" = 0 ]; then
  echo "smockron: not ready within 10 s (admin endpoints 127.0.0.1:9105 and 127.0.0.1:9106 do not answer)" >&2
  exit 1
fi
echo
echo "Smockron is running (config: $config)"
if [ -n "${1:-}" ]; then
  echo "  admin:   curl -s http://127.0.0.1:9106/metrics (proxy); curl -s http://127.0.0.1:9105/status (master)"
  echo "Ctrl-C to stop."
else
  cat <<MSG
  proxy:   http://127.0.0.1:8080/   (demo domain: 2/s, burst 5, per X-API-Key or client IP)
  accepted, then delayed (held, one every 500 ms):
           for i in \$(seq 12); do curl -s -o /dev/null -w '%{http_code} %{time_total}s\n' -H 'X-API-Key: alice' http://127.0.0.1:8080/; done
  rejected (503 + Retry-After once a wait would exceed max_delay = 5s):
           seq 30 | xargs -P30 -I{} curl -s -o /dev/null -w '%{http_code} retry-after=%header{retry-after}\n' -H 'X-API-Key: bob' http://127.0.0.1:8080/
  metrics: curl -s http://127.0.0.1:9106/metrics | grep smockron_proxy_requests_total
  master:  curl -s http://127.0.0.1:9105/status
Ctrl-C to stop.
MSG
fi
# Until Ctrl-C or until any of them exits.
set +e
wait -n "${!names[@]}"
gone "stopped on its own"
