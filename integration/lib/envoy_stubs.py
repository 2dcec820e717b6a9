"""Python stubs of Envoy's rate limit services, generated at test time from
the master's own declarations (master/envoy/proto) by Debian's protoc and
grpc_python_plugin, for Debian's python3-grpcio (run with /usr/bin/python3).
Generated once per process into a temporary folder put on sys.path."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

# Debian's python3-grpcio and python3-protobuf, for a pyenv/venv Python of the
# same minor version too (appended: the interpreter's own packages first).
_DIST = "/usr/lib/python3/dist-packages"
if _DIST not in sys.path:
    sys.path.append(_DIST)

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "master", "envoy", "proto")
_out: str | None = None


def load():
    """Returns (rls_pb2, rls_pb2_grpc, rlqs_pb2, rlqs_pb2_grpc)."""
    global _out
    if _out is None:
        _out = tempfile.mkdtemp(prefix="smockron-envoy-stubs-")
        atexit.register(shutil.rmtree, _out, True)
        protos = []
        for root, _, files in os.walk(os.path.join(PROTO_DIR, "envoy")):
            protos += [os.path.relpath(os.path.join(root, f), PROTO_DIR) for f in files if f.endswith(".proto")]
        subprocess.run(["protoc", f"-I{PROTO_DIR}", f"--python_out={_out}", f"--grpc_out={_out}",
                        "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin", *sorted(protos)], check=True)
        for root, _, _ in os.walk(os.path.join(_out, "envoy")):
            open(os.path.join(root, "__init__.py"), "a").close()
        sys.path.insert(0, _out)
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc  # noqa: E402
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402
    return rls_pb2, rls_pb2_grpc, rlqs_pb2, rlqs_pb2_grpc
