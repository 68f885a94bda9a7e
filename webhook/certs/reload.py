"""The webhook's one ``SSLContext`` (TLS 1.2 or newer, forward-secret AEAD ciphers only), reloaded
in place when its source gives a new certificate — the serving Secret's watch (:mod:`.secret`), or
files looked at every few seconds — so a renewal needs no restart and fails no request; and the
served certificate's expiry. No HTTP here: :mod:`volcano_job_webhook.server.https` serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509

from .files import write_fd
from .issue import describe

log = logging.getLogger(__name__)

Pair = tuple[bytes, bytes]  # a certificate (chain) and its key, PEM

# Mozilla "intermediate" for TLS 1.2: ECDHE with AES-GCM or ChaCha20-Poly1305, for ECDSA and RSA
# certificates (cert-manager's may be RSA). TLS 1.3's suites are all AEAD already.
TLS12_CIPHERS = ":".join([
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
])


def make_server_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    client_ca_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A server-side context serving ``cert_file``/``key_file``, TLS 1.2 or newer, without
    compression or renegotiation; with ``client_ca_file``, every client must present a certificate
    that CA signed. Raises ``ssl.SSLError`` or ``OSError`` when the pair does not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    if client_ca_file is not None:  # else CERT_NONE, a server context's default
        context.load_verify_locations(cafile=os.fspath(client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _memory_file(opened: contextlib.ExitStack, blob: bytes) -> str:
    """A path reading back ``blob`` from an anonymous in-memory file (Linux ``memfd``), closed with ``opened``."""
    if not os.path.isdir("/proc/self/fd"):
        raise OSError("no /proc/self/fd")
    fd = os.memfd_create("volcano-webhook-tls", getattr(os, "MFD_CLOEXEC", 0))
    opened.callback(os.close, fd)
    write_fd(fd, blob)
    return f"/proc/self/fd/{fd}"


@contextlib.contextmanager
def _pinned_files(*blobs: bytes) -> Iterator[list[str]]:
    """Paths that read back exactly ``blobs``, for ``load_cert_chain`` (which only takes paths), so
    that the pair checked and the pair loaded are one snapshot even while a writer replaces the
    files. Anonymous memory files where Linux has them (keys never touch a disk), else a private
    temporary directory."""
    with contextlib.ExitStack() as opened:
        try:
            paths = [_memory_file(opened, blob) for blob in blobs]
        except (OSError, AttributeError):  # not Linux, or a seccomp profile without memfd_create
            tmp = opened.enter_context(tempfile.TemporaryDirectory(prefix="volcano-webhook-tls-"))
            paths = [os.path.join(tmp, str(i)) for i in range(len(blobs))]
            for path, blob in zip(paths, blobs, strict=True):
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
                    handle.write(blob)
        yield paths


def _read_pair(cert_file: Path, key_file: Path) -> Pair | None:
    """Both files' bytes (symlinks followed, as the kubelet's ``..data`` swap needs), or None while one is missing."""
    try:
        return cert_file.read_bytes(), key_file.read_bytes()
    except OSError:
        return None


class CertReloader:
    """Owns the ``ssl.SSLContext`` the HTTPS server serves with and keeps it serving the pair that
    ``read`` gives: when its bytes change, the pair is loaded into a scratch context and, only if that
    succeeds, into the live one (new handshakes get it, open connections keep theirs); a half-written,
    missing or mismatched pair is ignored until a later look. ``read`` is looked at on
    :meth:`reload_now` — what the Secret's watch calls on each change — and, with an ``interval``,
    that often (files, whose changes nothing announces).

    The poll runs on the server's loop (:meth:`poll`, :meth:`on_loop`), and :meth:`reload_now` from
    another thread is handed to it, because ``load_cert_chain`` replaces the certificate and then
    the key: on the loop, where handshakes start, none can start between the two. The client CA is
    loaded once (OpenSSL cannot remove a trust anchor from a context): rotating it needs a restart.
    """

    def __init__(
        self,
        read: Callable[[], Pair | None],
        origin: str,
        client_ca_file: str | os.PathLike[str] | None = None,
        interval: float | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Load ``read()``'s pair now (``origin`` names where it comes from in logs);
        ``FileNotFoundError`` when there is none, ``ssl.SSLError``/``OSError`` when it does not load."""
        self.read, self.origin = read, origin
        self.interval = interval
        self.clock = clock
        pair = read()
        if pair is None:
            raise FileNotFoundError(f"TLS certificate or key missing: {origin}")
        with _pinned_files(*pair) as (cert_path, key_path):
            self.context = make_server_context(cert_path, key_path, client_ca_file)
        self._serve(pair, "serving")
        self._failed: object = None  # what the last warning was about, so it is not repeated every tick
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_files(cls, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str],
                   client_ca_file: str | os.PathLike[str] | None = None, interval: float = 10.0,
                   *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> CertReloader:
        """The pair in two files (a certs directory, a mounted Secret), looked at every ``interval`` seconds."""
        read = functools.partial(_read_pair, Path(cert_file), Path(key_file))
        return cls(read, os.fspath(cert_file), client_ca_file, interval, clock=clock)

    def _serve(self, pair: Pair, what: str) -> None:
        self._loaded = pair
        try:
            cert: x509.Certificate | None = x509.load_pem_x509_certificate(pair[0])
        except ValueError:
            cert = None
        self.not_after = cert.not_valid_after_utc if cert is not None else None
        log.info("%s TLS certificate from %s: %s", what, self.origin, describe(pair[0], names=True))

    def reload_now(self) -> bool:
        """Look at ``read()`` now; True when a different pair was loaded, False when the bytes are the
        same or the new pair does not load. Safe from any thread."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop and loop.is_running() and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._reload_on_loop(), loop)
            return future.result(timeout=30)
        return self._reload()

    async def _reload_on_loop(self) -> bool:
        return self._reload()

    def _reload(self) -> bool:
        with self._lock:
            pair = self.read()
            if pair is None:
                self._warn_once("missing", "missing or unreadable")
                return False
            if pair == self._loaded:  # touched or rewritten with the same content
                return False
            try:
                with _pinned_files(*pair) as (cert_path, key_path):
                    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                    scratch.load_cert_chain(cert_path, key_path)  # the live context is untouched until this passes
                    self.context.load_cert_chain(cert_path, key_path)  # same bytes: cannot fail differently
            except (ssl.SSLError, OSError, ValueError) as exc:
                # ssl.SSLError.reason is OpenSSL's short code (KEY_VALUES_MISMATCH, ...), which never echoes file content.
                self._warn_once(pair, str(getattr(exc, "reason", None) or type(exc).__name__))
                return False
            self._serve(pair, "reloaded")
            self._failed = None
        return True

    def expiry_seconds(self) -> float:
        """Seconds from ``clock()`` until the served certificate's ``notAfter`` (negative once expired;
        NaN if it could not be parsed, though OpenSSL serves it)."""
        if self.not_after is None:
            return float("nan")
        return (self.not_after - self.clock()).total_seconds()

    def _warn_once(self, about: object, why: str) -> None:
        # A writer that never finishes, or a file left missing, would otherwise log every tick.
        if about != self._failed:
            log.warning("new TLS certificate/key from %s not loaded (%s); still serving the previous one, will retry",
                        self.origin, why)
        self._failed = about

    async def poll(self) -> None:
        """Look at ``read()`` every ``interval`` seconds until cancelled (at once done without an
        ``interval``); an error is logged and the poll goes on."""
        while self.interval is not None:
            await asyncio.sleep(self.interval)
            try:
                self._reload()
            except Exception:
                log.exception("TLS certificate poll failed; retrying in %ss", self.interval)

    @contextlib.contextmanager
    def on_loop(self) -> Iterator[None]:
        """While the block runs, reloads are done on the running loop (enter from inside it); after,
        the context keeps serving the last loaded certificate."""
        self._loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            self._loop = None
