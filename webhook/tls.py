"""HTTPS for the webhook: one ``SSLContext`` (TLS 1.2 or newer, forward-secret AEAD ciphers only)
that uvicorn serves with, reloaded in place when the certificate files change.

The API server is the webhook's only real client and speaks TLS 1.2+. No plaintext listener is ever
opened. Certificates renewed on disk (cert-manager rotates the mounted Secret) are picked up without
a restart: new handshakes get the new certificate, open connections carry on, nothing is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

# Mozilla "intermediate" for TLS 1.2: ECDHE key exchange with AES-GCM or ChaCha20-Poly1305.
# TLS 1.3 suites are fixed by OpenSSL and all strong.
TLS12_CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:" \
                "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"


def make_server_context(cert_file: Path, key_file: Path, client_ca_file: Path | None = None) -> ssl.SSLContext:
    """A server context: TLS 1.2+, modern ciphers, no compression or renegotiation; with
    ``client_ca_file``, clients (the API server) must present a certificate signed by that CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        context.load_verify_locations(cafile=str(client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _signature(*paths: Path) -> tuple[tuple[int, int, int], ...] | None:
    try:
        return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in (os.stat(p) for p in paths))
    except OSError:
        return None


class CertReloader:
    """Keeps ``context`` serving the certificate and key currently on disk.

    A changed pair is first loaded into a scratch context; a half-written or mismatched pair is
    ignored (the old certificate keeps being served) and tried again on the next look.
    """

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None, interval: float = 10.0) -> None:
        self.cert_file, self.key_file, self.client_ca_file = Path(cert_file), Path(key_file), client_ca_file
        self.interval = interval
        self.context = make_server_context(self.cert_file, self.key_file, client_ca_file)
        self._seen = _signature(self.cert_file, self.key_file)
        self.reloads = 0

    def reload_now(self) -> bool:
        """Load the files if they changed and make a valid pair; True when the served cert changed."""
        seen = _signature(self.cert_file, self.key_file)
        if seen is None or seen == self._seen:
            return False
        try:
            make_server_context(self.cert_file, self.key_file)  # validate before touching the live one
            self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError, ValueError) as exc:
            log.warning("new certificate files not loaded yet (%s); still serving the previous certificate", type(exc).__name__)
            return False
        self._seen = seen
        self.reloads += 1
        log.info("serving a renewed certificate from %s", self.cert_file)
        return True

    async def run(self) -> None:
        """Look for changed files every ``interval`` seconds, on the server's event loop (handshakes
        run there too, so the context never changes under one)."""
        while True:
            await asyncio.sleep(self.interval)
            self.reload_now()


class _Server(uvicorn.Server):
    """uvicorn's server, with the certificate reloader running beside it."""

    def __init__(self, config: uvicorn.Config, reloader: CertReloader) -> None:
        super().__init__(config)
        self.reloader = reloader
        self._task: asyncio.Task[None] | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self._task = asyncio.create_task(self.reloader.run())

    async def shutdown(self, sockets: Any = None) -> None:
        if self._task is not None:
            self._task.cancel()
        await super().shutdown(sockets)


def build_server(
    app: Any,
    host: str,
    port: int,
    cert_file: Path,
    key_file: Path,
    *,
    client_ca_file: Path | None = None,
    reload_interval: float = 10.0,
    **uvicorn_kwargs: Any,
) -> uvicorn.Server:
    """A uvicorn server over our context (``server.reloader``); ``run()`` it, set ``should_exit`` to stop."""
    reloader = CertReloader(cert_file, key_file, client_ca_file, reload_interval)
    factory: Callable[[uvicorn.Config, Callable[[], ssl.SSLContext]], ssl.SSLContext] = lambda config, default: reloader.context
    uvicorn_kwargs.setdefault("log_config", None)  # our JSON logging stays in charge
    uvicorn_kwargs.setdefault("timeout_graceful_shutdown", 10)
    config = uvicorn.Config(app, host=host, port=port, ssl_certfile=str(cert_file), ssl_keyfile=str(key_file),
                            ssl_context_factory=factory, **uvicorn_kwargs)
    return _Server(config, reloader)


def serve(app: Any, host: str, port: int, cert_file: Path, key_file: Path, **kwargs: Any) -> None:
    """Serve ``app`` over HTTPS until SIGINT/SIGTERM (uvicorn stops gracefully on both)."""
    build_server(app, host, port, cert_file, key_file, **kwargs).run()
