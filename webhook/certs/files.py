"""A certificates directory: the bundle as files, written atomically, keys mode 0600.

``serve`` and ``certs`` keep the development CA and serving certificate here (``certs/`` by default).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from .issue import (
    CA_CERT,
    CA_KEY,
    CA_RENEW_BEFORE,
    RENEW_BEFORE,
    TLS_CERT,
    TLS_KEY,
    CertBundle,
    RenewBefore,
    bundle_is_good,
    default_sans,
    issue_bundle,
    serves_until,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CertPaths:
    """Where :func:`ensure_certs` left the files; ``created`` is True when it wrote any."""

    ca_cert: Path
    cert: Path
    key: Path
    created: bool


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable; not every filesystem lets a directory be opened, which is harmless.
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old file or the new one, never a
    part. A temporary file in the same directory (so ``os.replace`` is a rename on one filesystem)
    is created with ``mode`` by ``os.open`` — a private key is never readable by others, not even
    for an instant — then written, fsynced and renamed over ``path``.

    A umask can only narrow the mode; the exact ``mode`` is restored with ``fchmod`` *before* any
    byte is written, and that never widens it beyond ``mode``.
    """
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def load_bundle(certs_dir: Path) -> CertBundle | None:
    """The bundle in ``certs_dir`` (``ca.crt``, ``tls.crt``, ``tls.key``, and ``ca.key`` when
    present), or None when any of the first three is missing. The PEMs are not parsed here."""
    certs_dir = Path(certs_dir)
    ca_cert, cert, key = (_read(certs_dir / name) for name in (CA_CERT, TLS_CERT, TLS_KEY))
    if ca_cert is None or cert is None or key is None:
        return None
    return CertBundle(ca_cert=ca_cert, cert=cert, key=key, ca_key=_read(certs_dir / CA_KEY))


def ensure_certs(
    certs_dir: Path,
    service: str = "volcano-job-webhook",
    namespace: str = "volcano-job-webhook",
    *,
    renew_before: RenewBefore | timedelta = RENEW_BEFORE,
    ca_renew_before: RenewBefore | timedelta = CA_RENEW_BEFORE,
    now: datetime | None = None,
) -> CertPaths:
    """Make ``certs_dir`` hold a good bundle for the Service's names (:func:`default_sans`).

    A new serving certificate is issued when ``tls.crt``/``tls.key`` are missing or unreadable, the
    key does not match, no CA of ``ca.crt`` signed it, a required SAN is missing, or it is due
    (``renew_before``) or its CA is (``ca_renew_before``). It is signed by the existing
    ``ca.crt``/``ca.key`` when that CA is usable, else by a new CA. Files are written atomically (key
    before certificate, so a watcher that sees a new ``tls.crt`` finds its key already there); keys
    0600, certificates 0644; a file whose bytes do not change is not rewritten.

    Idempotent: when the bundle is good nothing is written (same bytes, same mtimes). A bundle
    without ``ca.key`` was issued elsewhere (cert-manager, the certs Job and CronJob) and is mounted
    read-only: it is kept as long as it can be served at all — its key matches, a CA of ``ca.crt``
    (which may hold several, during a CA rotation) signed it, neither has expired — even when it is
    due for renewal, because renewing it is its issuer's job and a webhook that cannot start (a write
    to a read-only mount) serves nobody; the names are its issuer's business too.
    """
    certs_dir = Path(certs_dir)
    paths = CertPaths(certs_dir / CA_CERT, certs_dir / TLS_CERT, certs_dir / TLS_KEY, created=False)
    existing = load_bundle(certs_dir)
    if existing is not None and existing.ca_key is None:
        until = serves_until(existing, now)
        if until is not None:
            if not bundle_is_good(existing, [], [], renew_before, now, ca_renew_before):
                log.warning("the certificate in %s is due for renewal (it expires %s); its issuer renews it",
                            certs_dir, until.isoformat())
            return paths
    ca_cert, ca_key = _read(certs_dir / CA_CERT), _read(certs_dir / CA_KEY)
    dns, ips = default_sans(service, namespace)
    bundle, changed = issue_bundle(existing, dns, ips, renew_before=renew_before, ca_renew_before=ca_renew_before, now=now,
                                   ca=(ca_cert, ca_key) if ca_cert is not None and ca_key is not None else None)
    if not changed:
        return paths
    certs_dir.mkdir(parents=True, exist_ok=True)
    writes: list[tuple[str, bytes | None, int]] = [
        (CA_KEY, bundle.ca_key, 0o600), (CA_CERT, bundle.ca_cert, 0o644),
        (TLS_KEY, bundle.key, 0o600), (TLS_CERT, bundle.cert, 0o644),
    ]
    for name, data, mode in writes:
        if data is not None and _read(certs_dir / name) != data:
            write_atomic(certs_dir / name, data, mode)
    return CertPaths(paths.ca_cert, paths.cert, paths.key, created=True)
