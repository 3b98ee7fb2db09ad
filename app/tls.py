"""One TLS client context per process, shared by every outbound HTTP client.

Each provider client and the webhook dispatcher would otherwise load the CA bundle into a
context of its own (httpx does so for every client it creates): tens of milliseconds of CPU and
a copy of the bundle in memory per client, at every start and for every agent profile. The
context is the one httpx builds by default (certifi's bundle, or ``SSL_CERT_FILE`` /
``SSL_CERT_DIR`` when set), made once, on first use.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_context() -> ssl.SSLContext:
    """The TLS context outbound requests verify servers with."""
    return httpx.create_ssl_context()
