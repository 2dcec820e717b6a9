#!/usr/bin/env bash
# The container image and the compose stack, built and run with podman (no
# Docker engine runs where the tests run): called by scripts/test.sh.
#   1. the Debian base image, made locally (scripts/podman-base.sh);
#   2. the image (Dockerfile, as shipped): built, its size recorded; run
#      with its default configuration: it answers on a published port (it
#      listens on every interface), its health check passes, it runs as
#      non-root and holds no compiler;
#   3. the compose stack (docker-compose.yml, as shipped) with podman-compose:
#      stand-ins for the images it names from Docker Hub (Redis, Python) are
#      built from the same base (integration/images/); every health check
#      passes, one client limited through proxy1 and proxy2 shares one limit,
#      the master restarted keeps its Redis state, and `down` leaves nothing;
#      then again with CURVE on the links (SMOCKRON_LINKS=curve, keys made by
#      scripts/compose-keys.sh), up to the shared limit.
# The checks are integration/image_checks.py; ports are free ones on 127.0.0.1.
# The image is built with warnings as errors (SMOCKRON_WERROR=ON): it is the
# test command's GCC Release build of the daemons.
#   scripts/test-image.sh            steps 1-3
#   scripts/test-image.sh --build    the images only (the test command builds
#                                    them beside other tests; the run after it
#                                    finds every layer built)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/podman-env.sh
export PYTHONUNBUFFERED=1
project=smockron-ci-$$
image_container=smockron-image-check-$$

cleanup() {
  podman rm -f "$image_container" >/dev/null 2>&1 || true
  podman-compose -p "$project" -f docker-compose.yml down -v -t 5 >/dev/null 2>&1 || true
}
trap cleanup EXIT

bash scripts/podman-base.sh

echo "== image: podman build (Dockerfile)"
started=$(date +%s)
# The build stage's compiler cache is this machine's (ccache keys hold no
# path: build.sh sets the base directory), so a rebuild compiles only what
# changed. The image is the same either way.
ccache_dir=$(ccache --get-config cache_dir 2>/dev/null || echo "$HOME/.cache/ccache")
mkdir -p "$ccache_dir"
podman build --pull=never --format docker --build-arg SMOCKRON_WERROR=ON --volume "$ccache_dir:/root/.cache/ccache" \
  -t smockron:latest . > "$podman_dir/build.log" 2>&1 || { tail -40 "$podman_dir/build.log"; exit 1; }
size=$(podman image inspect --format '{{.Size}}' smockron:latest)
echo "built in $(( $(date +%s) - started )) s; image size $(( size / 1024 / 1024 )) MiB ($size bytes)"

echo "== compose: stand-in images for redis:7-bookworm and python:3.11-slim-bookworm"
podman build --pull=never --format docker -t redis:7-bookworm integration/images/redis > "$podman_dir/redis.log" 2>&1 \
  || { tail -20 "$podman_dir/redis.log"; exit 1; }
podman build --pull=never --format docker -t python:3.11-slim-bookworm integration/images/python \
  > "$podman_dir/python.log" 2>&1 || { tail -20 "$podman_dir/python.log"; exit 1; }
if [ "${1:-}" = "--build" ]; then exit 0; fi

echo "== image: run with its default configuration"
python3 integration/image_checks.py image --container "$image_container"

echo "== compose: podman-compose up (docker-compose.yml)"
python3 integration/image_checks.py compose --project "$project"
echo "== compose: podman-compose up with CURVE keys (SMOCKRON_LINKS=curve)"
python3 integration/image_checks.py compose --project "$project" --links curve
echo "== image and compose stack: OK"
