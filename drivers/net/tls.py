"""One TLS configuration for every request rampwatch makes (the httpx probes,
Prometheus and GPU readers, and the lean client's streams and /metrics
scrapes), so they cannot disagree about the same URL: certifi's bundle
(httpx's own default) unless --ca-bundle names another, or no verification
at all with --insecure."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi


class TlsError(ValueError):
    """A --ca-bundle that cannot be used; the message is one line for the user."""


def tls_context(ca_bundle: Path | None = None, insecure: bool = False) -> ssl.SSLContext:
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    cafile = str(ca_bundle) if ca_bundle is not None else certifi.where()
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"--ca-bundle {ca_bundle}: {getattr(e, 'strerror', None) or e}") from None


def is_untrusted(error: BaseException) -> bool:
    """Whether a connection failed because the server's certificate was not trusted."""
    text = f"{error} {error.__cause__ or ''} {error.__context__ or ''}"
    return "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text
