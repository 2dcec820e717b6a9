#!/usr/bin/env bash
# Makes the Debian base image the Dockerfile and the compose stack's
# stand-ins start from, without an image registry (none is reachable where
# this runs; the Debian archive is): debootstrap's minbase of bookworm from
# the archive apt uses, imported into podman and tagged debian:bookworm and
# debian:bookworm-slim. Does nothing when the image is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/podman-env.sh
if podman image exists debian:bookworm && podman image exists debian:bookworm-slim; then
  echo "base image debian:bookworm present"
  exit 0
fi
# The mirror apt uses here (deb822 or one-line sources), else Debian's own.
mirror=$(grep -hoE 'https?://[^ ]+/debian/?$' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
  | grep -v security | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
rootfs="$podman_dir/rootfs"
rm -rf "$rootfs"
echo "== debootstrap bookworm (minbase) from $mirror"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$podman_dir/debootstrap.log" 2>&1 \
  || { tail -20 "$podman_dir/debootstrap.log"; exit 1; }
# apt inside the image uses the same mirror.
echo "deb $mirror bookworm main" > "$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
tar -C "$rootfs" -c . | podman import --change 'CMD ["bash"]' - debian:bookworm
podman tag debian:bookworm debian:bookworm-slim
rm -rf "$rootfs"
echo "base image debian:bookworm ($(podman image inspect --format '{{.Size}}' debian:bookworm) bytes)"
