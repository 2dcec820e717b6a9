#!/bin/bash
# Makes the CURVE keys of the compose stack (SMOCKRON_LINKS=curve) in
# config/keys/ (or DIR): master.key/.pub, gatekeeper.key/.pub (both proxies
# use it) and `gatekeepers`, the list the master admits. Keys already there
# are kept. The secret keys are given to UID 10001, the image's user (as
# root), or made readable by everyone otherwise (then say so).
#   bash scripts/compose-keys.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-config/keys}
query=${SMOCKRON_QUERY:-$(command -v smockron-query || echo build/bin/smockron-query)}
[ -x "$query" ] || { echo "compose-keys: no smockron-query (build it, or set SMOCKRON_QUERY)" >&2; exit 1; }
mkdir -p "$dir"
for name in master gatekeeper; do
  [ -f "$dir/$name.key" ] || "$query" "keygen" "$dir/$name" >/dev/null  # (quoted: an argument, not a program)
done
cp "$dir/gatekeeper.pub" "$dir/gatekeepers"
if [ "$(id -u)" = 0 ]; then
  chown 10001:10001 "$dir"/*.key
else
  chmod 0644 "$dir"/*.key
  echo "compose-keys: $dir/*.key are readable by everyone (run as root to give them to UID 10001)" >&2
fi
echo "compose-keys: keys in $dir; start the stack with SMOCKRON_LINKS=curve"
