# Sourced by the scripts that run podman (scripts/test-image.sh): settings
# for an unprivileged sandbox without systemd, kept in build/podman/ and
# given through CONTAINERS_CONF, so nothing global changes: runc as the OCI
# runtime, cgroupfs as the cgroup manager, no default ulimits (the sandbox
# may not raise them), file-based events, and netavark networks (DNS between
# a compose stack's services by name).
podman_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/podman"
mkdir -p "$podman_dir"
cat > "$podman_dir/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
CONF
export CONTAINERS_CONF="$podman_dir/containers.conf"
