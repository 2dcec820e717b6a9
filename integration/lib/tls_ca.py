"""TestCA: a throw-away certificate authority (openssl command line, EC P-256,
valid two days) in a test's temp dir, and the certificates it issues."""
from __future__ import annotations

import os
import subprocess


class TestCA:
    """A CA and the certificates it signs (EC P-256, valid for two days), in `dir`."""

    def __init__(self, dir: str):
        self.dir = dir
        self.cert = self.path("ca.pem")
        self.key = self.path("ca.key")
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                      "-subj", "/CN=Smockron Test CA", "-keyout", self.key, "-out", self.cert)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def issue(self, name: str, cn: str, sans: str, usage: str = "serverAuth") -> tuple[str, str]:
        """A certificate for `cn` with subject alternative names `sans`
        ("DNS:localhost,IP:127.0.0.1"); returns (cert, key) paths."""
        cert, key, csr, ext = (self.path(f"{name}.{x}") for x in ("pem", "key", "csr", "ext"))
        with open(ext, "w") as f:
            f.write(f"subjectAltName={sans}\nextendedKeyUsage={usage}\n")
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={cn}",
                      "-keyout", key, "-out", csr)
        self._openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial",
                      "-days", "2", "-out", cert, "-extfile", ext)
        return cert, key
