"""Python stubs of Envoy's rate limit services, generated at test time from
the master's own declarations (master/envoy/proto) by Debian's protoc and
grpc_python_plugin, for Debian's python3-grpcio (run with /usr/bin/python3).
Generated once per process into a temporary folder put on sys.path
(compile_protos, which lib/otlp_receiver.py uses for OTLP's messages too)."""
from __future__ import annotations

import os
import sys

# Debian's python3-grpcio and python3-protobuf, for a pyenv/venv Python of the
# same minor version too (appended: the interpreter's own packages first).
_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "master", "envoy", "proto")
_compiled: set[tuple[str, str]] = set()


def compile_protos(proto_dir: str, package: str, grpc: bool) -> None:
    """Compiles every .proto under proto_dir/package (once per process) with Debian's protoc (and
    grpc_python_plugin when `grpc`) into a temporary folder put first on sys.path."""
    import atexit
    import shutil
    import subprocess
    import tempfile
    if (proto_dir, package) in _compiled:
        return
    out = tempfile.mkdtemp(prefix=f"smockron-{package}-stubs-")
    atexit.register(shutil.rmtree, out, True)
    protos = []
    for root, _, files in os.walk(os.path.join(proto_dir, package)):
        protos += [os.path.relpath(os.path.join(root, f), proto_dir) for f in files if f.endswith(".proto")]
    plugin = [f"--grpc_out={out}", "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] if grpc else []
    subprocess.run(["protoc", f"-I{proto_dir}", f"--python_out={out}", *plugin, *sorted(protos)], check=True,
                   timeout=60)
    for root, _, _ in os.walk(os.path.join(out, package)):
        open(os.path.join(root, "__init__.py"), "a").close()
    sys.path.insert(0, out)
    _compiled.add((proto_dir, package))


def load():
    """Returns (rls_pb2, rls_pb2_grpc, rlqs_pb2, rlqs_pb2_grpc)."""
    compile_protos(PROTO_DIR, "envoy", grpc=True)
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc  # noqa: E402
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402
    return rls_pb2, rls_pb2_grpc, rlqs_pb2, rlqs_pb2_grpc
