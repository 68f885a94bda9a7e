"""A certificates directory (``serve``'s and ``certs``' ``certs/`` by default): the bundle as files,
written atomically, keys mode 0600."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .issue import (
    CA_CERT,
    CA_KEY,
    DEFAULT_POLICY,
    TLS_CERT,
    TLS_KEY,
    CertBundle,
    Policy,
    bundle_is_good,
    ca_is_usable,
    default_sans,
    generate_ca,
    generate_serving_cert,
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
    # Makes the rename durable; not every filesystem lets a directory be opened or synced, which is harmless.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_fd(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``: one ``os.write`` may take only part."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` atomically (readers see the old file or the new one): a
    temporary file beside it, created with ``mode`` so a key is never readable by others, even for
    an instant, is written, fsynced and renamed over it."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:  # a umask narrowed it: the exact mode, before any byte
                os.fchmod(fd, mode)
            write_fd(fd, data)
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


def write_changed(certs_dir: Path, files: dict[str, bytes]) -> list[str]:
    """Write, in the order given, each of ``files`` whose bytes ``certs_dir`` does not hold yet (keys
    0600, certificates 0644); the names written."""
    certs_dir.mkdir(parents=True, exist_ok=True)
    written = [name for name, data in files.items() if _read(certs_dir / name) != data]
    for name in written:
        write_atomic(certs_dir / name, files[name], 0o600 if name.endswith(".key") else 0o644)
    return written


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
    policy: Policy = DEFAULT_POLICY,
    now: datetime | None = None,
) -> CertPaths:
    """Make ``certs_dir`` hold a good bundle for the Service's names (:func:`.issue.bundle_is_good`),
    writing only what changed, each key before its certificate (a watcher of ``tls.crt`` finds its key
    there): a due serving certificate is replaced under the directory's CA while that CA is usable, and
    a new CA, so a new ``caBundle``, comes only when it is not.

    A bundle without ``ca.key`` was issued elsewhere (cert-manager, the certs Job) and may be mounted
    read-only: it is kept while it can be served at all, due or not, since renewing it (and its
    names) is its issuer's job and a webhook that cannot start serves nobody.
    """
    certs_dir = Path(certs_dir)
    paths = CertPaths(certs_dir / CA_CERT, certs_dir / TLS_CERT, certs_dir / TLS_KEY, created=False)
    existing = load_bundle(certs_dir)
    if existing is not None and existing.ca_key is None:
        until = serves_until(existing, now)
        if until is not None:
            if not bundle_is_good(existing, [], [], policy, now):
                log.warning("the certificate in %s is due for renewal (it expires %s); its issuer renews it",
                            certs_dir, until.isoformat())
            return paths
    dns, ips = default_sans(service, namespace)
    if existing is not None and bundle_is_good(existing, dns, ips, policy, now):
        return paths
    # The CA survives the serving files (ca.crt and ca.key without tls.*: the pair is still read).
    ca_cert, ca_key = _read(certs_dir / CA_CERT), _read(certs_dir / CA_KEY)
    if ca_cert is None or ca_key is None or not ca_is_usable(ca_cert, ca_key, policy.ca_renew_before, now):
        ca_cert, ca_key = generate_ca(days=policy.ca_days, now=now)
    cert, key = generate_serving_cert(ca_cert, ca_key, dns, ips, days=policy.serving_days, now=now)
    write_changed(certs_dir, {CA_KEY: ca_key, CA_CERT: ca_cert, TLS_KEY: key, TLS_CERT: cert})
    return CertPaths(paths.ca_cert, paths.cert, paths.key, created=True)
