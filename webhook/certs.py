"""Certificates for the webhook: a private CA and a serving certificate, made with ``cryptography``.

A :class:`CertBundle` is the three PEM files Kubernetes TLS Secrets hold (``ca.crt``, ``tls.crt``,
``tls.key``; plus ``ca.key`` when we own the CA). :func:`issue_bundle` keeps a bundle that is still
good — signed by its CA, covering the names, not close to expiry — and makes a new one otherwise, so
both the certs directory (:func:`ensure_certs`) and a cluster Secret can be kept idempotently.

Keys are ECDSA P-256: small, fast to handshake, accepted by every Kubernetes API server.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA and a serving certificate. ``repr`` never shows key material."""

    ca_cert: bytes
    cert: bytes
    key: bytes
    ca_key: bytes | None = None

    def __repr__(self) -> str:
        return f"CertBundle(serial={x509.load_pem_x509_certificate(self.cert).serial_number:x}, keys=<redacted>)"


@dataclass(frozen=True)
class CertPaths:
    ca_cert: Path
    cert: Path
    key: Path
    created: bool


def default_sans(service: str = "volcano-job-webhook", namespace: str = "volcano-job-webhook") -> tuple[list[str], list[str]]:
    """DNS names and IPs of the serving certificate: loopback for local use, the Service's names."""
    dns = ["localhost", service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
    return dns, ["127.0.0.1", "::1"]


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(timezone.utc)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def generate_ca(common_name: str = "volcano-job-webhook-ca", days: int = 3650, now: datetime | None = None) -> tuple[bytes, bytes]:
    """A self-signed CA: (cert PEM, key PEM)."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now(now) - timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def generate_serving_cert(
    ca_cert_pem: bytes, ca_key_pem: bytes, dns_names: list[str], ips: list[str], days: int = 365, now: datetime | None = None
) -> tuple[bytes, bytes]:
    """A serving certificate for ``dns_names`` and ``ips``, signed by the CA: (cert PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = _key()
    start = _now(now) - timedelta(minutes=5)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[-1] if dns_names else "volcano-job-webhook")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)  # type: ignore[arg-type]
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def needs_renewal(cert_pem: bytes, renew_before: timedelta = RENEW_BEFORE, now: datetime | None = None) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_after_utc - renew_before <= _now(now) or cert.not_valid_before_utc > _now(now)


def cert_covers(cert_pem: bytes, dns_names: list[str], ips: list[str]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(sans.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return set(dns_names) <= have_dns and {str(ipaddress.ip_address(ip)) for ip in ips} <= have_ips


def _signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    cert, ca = x509.load_pem_x509_certificate(cert_pem), x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def _key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, password=None)
    cert = x509.load_pem_x509_certificate(cert_pem)
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*der) == cert.public_key().public_bytes(*der)


def bundle_is_good(bundle: CertBundle, dns_names: list[str], ips: list[str], renew_before: timedelta = RENEW_BEFORE,
                   now: datetime | None = None) -> bool:
    """Signed by its CA, with the matching key, covering the names, neither cert close to expiry."""
    try:
        return (
            _signed_by(bundle.cert, bundle.ca_cert)
            and _key_matches(bundle.cert, bundle.key)
            and cert_covers(bundle.cert, dns_names, ips)
            and not needs_renewal(bundle.cert, renew_before, now)
            and not needs_renewal(bundle.ca_cert, renew_before, now)
        )
    except ValueError:  # unreadable PEM
        return False


def issue_bundle(existing: CertBundle | None, dns_names: list[str], ips: list[str], *,
                 renew_before: timedelta = RENEW_BEFORE, now: datetime | None = None) -> tuple[CertBundle, bool]:
    """``existing`` when it is still good, else a new bundle; the flag says whether it changed.

    A valid CA whose key we have is kept, so what the API server trusts (the ``caBundle``) does not
    change when only the serving certificate is renewed.
    """
    if existing is not None and bundle_is_good(existing, dns_names, ips, renew_before, now):
        return existing, False
    ca_cert, ca_key = (existing.ca_cert, existing.ca_key) if existing is not None else (None, None)
    if ca_cert is None or ca_key is None or needs_renewal(ca_cert, renew_before, now):
        ca_cert, ca_key = generate_ca(now=now)
    cert, key = generate_serving_cert(ca_cert, ca_key, dns_names, ips, now=now)
    return CertBundle(ca_cert=ca_cert, cert=cert, key=key, ca_key=ca_key), True


def _write(path: Path, data: bytes, mode: int) -> None:
    """Atomically: a temporary file created with ``mode`` (never wider), then renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_bundle(certs_dir: Path) -> CertBundle | None:
    """The bundle in ``certs_dir``, or None when ``ca.crt``, ``tls.crt`` or ``tls.key`` is missing."""
    try:
        ca_key_path = certs_dir / CA_KEY
        return CertBundle(
            ca_cert=(certs_dir / CA_CERT).read_bytes(),
            cert=(certs_dir / TLS_CERT).read_bytes(),
            key=(certs_dir / TLS_KEY).read_bytes(),
            ca_key=ca_key_path.read_bytes() if ca_key_path.exists() else None,
        )
    except FileNotFoundError:
        return None


def ensure_certs(certs_dir: Path, service: str = "volcano-job-webhook", namespace: str = "volcano-job-webhook", *,
                 renew_before: timedelta = RENEW_BEFORE, now: datetime | None = None) -> CertPaths:
    """Make ``certs_dir`` hold a good bundle; write nothing when it already does (a read-only mount
    of a cert-manager Secret is fine). Private keys are written mode 0600, certificates 0644."""
    certs_dir = Path(certs_dir)
    paths = (certs_dir / CA_CERT, certs_dir / TLS_CERT, certs_dir / TLS_KEY)
    dns, ips = default_sans(service, namespace)
    existing = load_bundle(certs_dir)
    if existing is not None and existing.ca_key is None and bundle_is_good(existing, [], [], renew_before, now):
        # Issued elsewhere (cert-manager, the certgen Job): theirs to name and renew.
        return CertPaths(*paths, created=False)
    bundle, changed = issue_bundle(existing, dns, ips, renew_before=renew_before, now=now)
    if changed:
        certs_dir.mkdir(parents=True, exist_ok=True)
        if bundle.ca_key is not None:
            _write(certs_dir / CA_KEY, bundle.ca_key, 0o600)
        _write(certs_dir / CA_CERT, bundle.ca_cert, 0o644)
        # Key before cert: a reloader that sees the new cert finds its key already there.
        _write(certs_dir / TLS_KEY, bundle.key, 0o600)
        _write(certs_dir / TLS_CERT, bundle.cert, 0o644)
    return CertPaths(*paths, created=changed)
