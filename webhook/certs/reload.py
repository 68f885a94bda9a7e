"""The webhook's one ``SSLContext`` (TLS 1.2 or newer, forward-secret AEAD ciphers only), reloaded
in place when the certificate files change, and the served certificate's expiry.

The API server is the webhook's only real client and speaks TLS 1.2+. Certificates renewed on disk
(cert-manager or the kubelet rotating a mounted Secret, ``volcano-webhook certs``) are picked up
without a restart: new handshakes get the new certificate, open connections carry on, no request
fails.

Nothing here knows about HTTP or uvicorn: :class:`~volcano_job_webhook.server.https.HTTPSServer`
serves with :attr:`CertReloader.context` and runs the watch for as long as it listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509

log = logging.getLogger(__name__)

# Mozilla "intermediate" for TLS 1.2: ECDHE key exchange (forward secrecy) with AES-GCM or
# ChaCha20-Poly1305 (AEAD) only — no CBC, no RSA key transport, no SHA-1 MACs. Both ECDSA and RSA
# variants, so a cert-manager RSA certificate works too. TLS 1.3's suites are all AEAD and fixed
# by OpenSSL; ``set_ciphers`` does not touch them.
TLS12_CIPHERS = ":".join([
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
])
DEFAULT_ALPN = ("http/1.1",)


def make_server_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    client_ca_file: str | os.PathLike[str] | None = None,
    *,
    alpn_protocols: Sequence[str] | None = DEFAULT_ALPN,
) -> ssl.SSLContext:
    """A server-side context serving ``cert_file``/``key_file``.

    Promises: TLS 1.2 minimum; TLS 1.2 ciphers from :data:`TLS12_CIPHERS` only; no TLS compression
    (CRIME) and no renegotiation (where OpenSSL offers the option); the server's cipher order wins.
    With ``client_ca_file`` every client must present a certificate that CA signed
    (``CERT_REQUIRED``) — the API server's client certificate. Raises ``ssl.SSLError`` or
    ``OSError`` when the files do not load or the key does not match the certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    if alpn_protocols:
        context.set_alpn_protocols(list(alpn_protocols))
    context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    if client_ca_file is not None:
        context.load_verify_locations(cafile=os.fspath(client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


Signature = tuple[tuple[int, int, int], ...]


def file_signature(*paths: Path) -> Signature | None:
    """``(mtime_ns, size, inode)`` of each path (symlinks followed, so the kubelet's ``..data``
    swap of a mounted Secret shows), or None while any of them is missing."""
    try:
        return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in (os.stat(p) for p in paths))
    except OSError:
        return None


def _memory_files(blobs: Sequence[bytes]) -> list[int] | None:
    """Anonymous in-memory files holding ``blobs`` (Linux ``memfd``), or None where unavailable."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    fds: list[int] = []
    try:
        for blob in blobs:
            fds.append(os.memfd_create("volcano-webhook-tls", getattr(os, "MFD_CLOEXEC", 0)))
            view = memoryview(blob)
            while view:
                view = view[os.write(fds[-1], view):]
    except OSError:  # e.g. a seccomp profile without memfd_create: use the fallback
        for fd in fds:
            os.close(fd)
        return None
    return fds


@contextlib.contextmanager
def _pinned_files(*blobs: bytes) -> Iterator[list[str]]:
    """Paths that read back exactly ``blobs``, for ``load_cert_chain`` (which only takes paths).

    Validating the files on disk and then loading them again could read two different versions (a
    writer between the two reads) and leave the live context with a certificate whose key was
    rejected. Loading both times from one in-memory snapshot rules that out. Linux: anonymous
    memory files (``memfd``), so keys never touch a disk; elsewhere a private temporary directory
    (mode 0700, files 0600), removed on exit.
    """
    fds = _memory_files(blobs)
    if fds is not None:
        try:
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="volcano-webhook-tls-") as tmp:
        paths = []
        for i, blob in enumerate(blobs):
            path = os.path.join(tmp, str(i))
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
                handle.write(blob)
            paths.append(path)
        yield paths


@dataclass(frozen=True)
class _Snapshot:
    signature: Signature
    cert: bytes
    key: bytes

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.cert + b"\0" + self.key).digest()


def _read_snapshot(cert_file: Path, key_file: Path) -> _Snapshot | None:
    # Stat before reading: if the files change after the stat, the next look sees a new signature
    # and loads again, so a change can never be missed (at worst it is loaded twice).
    signature = file_signature(cert_file, key_file)
    if signature is None:
        return None
    try:
        return _Snapshot(signature, cert_file.read_bytes(), key_file.read_bytes())
    except OSError:
        return None


def _describe(cert_pem: bytes) -> str:
    """Serial, expiry and names of the first certificate — what a reload log line may say."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "unparsable certificate"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans = ",".join(str(v) for v in (*names.get_values_for_type(x509.DNSName), *names.get_values_for_type(x509.IPAddress)))
    except x509.ExtensionNotFound:
        sans = ""
    expired = " (EXPIRED)" if cert.not_valid_after_utc <= datetime.now(UTC) else ""
    return f"serial={cert.serial_number:x} not_after={cert.not_valid_after_utc.isoformat()}{expired} sans={sans}"


def _not_after(cert_pem: bytes) -> datetime | None:
    try:
        return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
    except ValueError:
        return None


def _reason(exc: BaseException) -> str:
    # ssl.SSLError.reason is OpenSSL's short code (KEY_VALUES_MISMATCH, NO_START_LINE, ...): enough
    # to act on, and unlike some messages never echoes file content.
    return str(getattr(exc, "reason", None) or type(exc).__name__)


class CertReloader:
    """Owns the one ``ssl.SSLContext`` the HTTPS server serves with and keeps it serving the
    certificate and key currently on disk.

    Every ``interval`` seconds it compares the files' ``(mtime_ns, size, inode)``; on a change it
    reads both, loads the pair into a scratch context and, only if that succeeds, into the live
    ``context`` with ``load_cert_chain`` — the same object, so new handshakes use the new
    certificate while open connections keep theirs. A half-written, missing or mismatched pair is
    ignored (the previous certificate stays) and tried again on the next look.

    Why an asyncio task on the server's loop rather than a thread: the loop thread is where every
    handshake creates its ``SSL`` object from this context, and ``load_cert_chain`` (which releases
    the GIL) replaces the certificate and then the key in two steps. Run on the loop, no handshake
    can start between them; from a thread one could get the new certificate with no key. The server
    calls :meth:`start` in its startup and :meth:`stop` in its shutdown, so the task lives exactly
    as long as the listener. :meth:`reload_now` called from another thread is handed to the loop for the same
    reason.

    The client CA (``client_ca_file``) is loaded once: OpenSSL can add trust anchors to a context
    but not remove them, so rotating it needs a restart.

    ``not_after`` is the served certificate's expiry, set on every load; :meth:`expiry_seconds`
    measures it against ``clock`` (the metric ``volcano_webhook_certificate_expiry_seconds``).
    """

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        client_ca_file: str | os.PathLike[str] | None = None,
        interval: float = 10.0,
        *,
        alpn_protocols: Sequence[str] | None = DEFAULT_ALPN,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Load the pair now (raises ``ssl.SSLError``/``OSError`` when it does not load: better no
        server than a server with nothing to serve)."""
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.client_ca_file = Path(client_ca_file) if client_ca_file is not None else None
        self.interval = interval
        self.clock = clock
        snapshot = _read_snapshot(self.cert_file, self.key_file)
        if snapshot is None:
            raise FileNotFoundError(f"TLS certificate or key missing: {self.cert_file}, {self.key_file}")
        with _pinned_files(snapshot.cert, snapshot.key) as (cert_path, key_path):
            self.context = make_server_context(cert_path, key_path, self.client_ca_file, alpn_protocols=alpn_protocols)
        self._loaded = snapshot.signature, snapshot.digest
        self.not_after = _not_after(snapshot.cert)
        self._failed: object = None  # what the last warning was about, so it is not repeated every tick
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0
        log.info("serving TLS certificate %s: %s", self.cert_file, _describe(snapshot.cert))

    def reload_now(self, *, force: bool = False) -> bool:
        """Look at the files now; True when a different certificate/key pair was loaded into the
        live context. False when nothing changed (same signature, or same bytes — e.g. a touch) or
        the new pair does not load; then the previous certificate keeps being served. ``force``
        skips the signature comparison. Safe from any thread."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop and loop.is_running() and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._reload_on_loop(force), loop)
            return future.result(timeout=30)
        return self._reload(force)

    async def _reload_on_loop(self, force: bool) -> bool:
        return self._reload(force)

    def _reload(self, force: bool) -> bool:
        with self._lock:
            loaded_signature, loaded_digest = self._loaded
            if not force and file_signature(self.cert_file, self.key_file) == loaded_signature:
                return False
            snapshot = _read_snapshot(self.cert_file, self.key_file)
            if snapshot is None:
                self._warn_once("missing", "missing or unreadable")
                return False
            if snapshot.digest == loaded_digest:  # touched or rewritten with the same content
                self._loaded = snapshot.signature, loaded_digest
                return False
            try:
                with _pinned_files(snapshot.cert, snapshot.key) as (cert_path, key_path):
                    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                    scratch.load_cert_chain(cert_path, key_path)  # the live context is untouched until this passes
                    self.context.load_cert_chain(cert_path, key_path)  # same bytes: cannot fail differently
            except (ssl.SSLError, OSError, ValueError) as exc:
                self._warn_once(snapshot.signature, _reason(exc))
                return False
            self._loaded = snapshot.signature, snapshot.digest
            self.not_after = _not_after(snapshot.cert)
            self._failed = None
            self.reloads += 1
        log.info("reloaded TLS certificate %s: %s", self.cert_file, _describe(snapshot.cert))
        return True

    def expiry_seconds(self) -> float:
        """Seconds from ``clock()`` until the served certificate's ``notAfter`` (negative once it
        has expired; NaN if it could not be parsed — OpenSSL served it all the same)."""
        if self.not_after is None:
            return float("nan")
        return (self.not_after - self.clock()).total_seconds()

    def _warn_once(self, about: object, why: str) -> None:
        # A writer that never finishes, or a file left missing, would otherwise log every tick.
        if about != self._failed:
            log.warning("new TLS certificate/key in %s not loaded (%s); still serving the previous one, will retry",
                        self.cert_file.parent, why)
        self._failed = about

    async def run(self) -> None:
        """Look for changed files every ``interval`` seconds, forever (cancel to stop). An
        unexpected error is logged and the watch goes on: the served certificate is never lost."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self._reload(force=False)
            except Exception:
                log.exception("TLS certificate watch failed; retrying in %ss", self.interval)

    def start(self) -> asyncio.Task[None]:
        """Start watching on the running loop (call from inside it); idempotent."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._loop = loop
            self._task = loop.create_task(self.run(), name="tls-cert-reloader")
        return self._task

    async def stop(self) -> None:
        """Stop watching; the context keeps serving the last loaded certificate."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loop = None
