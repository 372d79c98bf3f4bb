"""A self-signed certificate for 127.0.0.1 that no default store trusts: the tests' and benchmarks' https
servers (the simulated engine's --tls-cert, hand-made servers) and what their clients trust (--ca-bundle)."""

from __future__ import annotations

from pathlib import Path

from tests import procs


def self_signed(folder: Path) -> tuple[str, str]:
    """(certificate, key) PEM files made in `folder` with openssl."""
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"]
    for_loopback = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    procs.run([*request, *for_loopback], check=True, capture_output=True)
    return cert, key
