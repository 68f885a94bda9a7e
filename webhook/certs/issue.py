"""Certificates for the webhook: a private CA and a serving certificate, made with ``cryptography``.

A :class:`CertBundle` is what a Kubernetes ``kubernetes.io/tls`` Secret holds (``ca.crt``,
``tls.crt``, ``tls.key``; plus ``ca.key`` in a local certs directory, where we own the CA), as PEM
bytes. ``ca.crt`` may hold several CA certificates (a trust bundle: during a CA rotation both the old
and the new CA). :func:`issue_bundle` keeps a bundle that is still good — the key matches, a CA of
``ca.crt`` signed it, it covers the names, it is not due for renewal — and issues a new one otherwise
(reusing a still-valid CA, so the ``caBundle`` the API server trusts does not change when only the
serving certificate is renewed). It knows nothing of files or clusters: a certs directory
(:func:`ensure_certs`) and the cluster's Secrets (:mod:`.rotation`, :mod:`.cluster`) share it.

When a certificate is due is a :class:`RenewBefore`: a fraction of its lifetime (the default: the
last third) or a fixed time before its ``notAfter``.

Key material (``ca.key``, ``tls.key``) never appears in a ``repr``, a log line or an exception
message raised here; private keys are written mode 0600, created with that mode.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# File names of a Kubernetes TLS Secret (``ca.key`` is ours: the CA survives renewals).
CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
CA_DAYS, SERVING_DAYS = 3650, 365
# Certificates start a little in the past so a peer whose clock lags ours still accepts them.
BACKDATE = timedelta(minutes=5)
_CN_MAX = 64  # RFC 5280 ub-common-name; longer Service FQDNs must not go in the CN

# What a malformed PEM, an unsupported or encrypted key raises while loading; none of these
# messages quote the input, so catching and re-raising them does not leak key material.
_BAD_PEM = (ValueError, TypeError, UnsupportedAlgorithm)


@dataclass(frozen=True)
class RenewBefore:
    """When a certificate is due for renewal: in the last ``fraction`` of its lifetime
    (``notBefore`` to ``notAfter``), or ``period`` before its ``notAfter`` — exactly one of the two.

    A fraction suits certificates of any lifetime: a 365-day serving certificate is renewed with
    about 122 days left, a 10-year CA with about 3.3 years left, and a certificate cut short to
    its CA's expiry is renewed in proportion. :meth:`parse` reads ``"33%"`` or ``"30d"``/``"720h"``.
    """

    fraction: float | None = None
    period: timedelta | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.period is None):
            raise ValueError("give exactly one of fraction and period")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise ValueError(f"a renewal fraction must be between 0 and 1 (exclusive), got {self.fraction}")
        if self.period is not None and self.period < timedelta(0):
            raise ValueError("a renewal period cannot be negative")

    @classmethod
    def parse(cls, text: str) -> RenewBefore:
        """``"33%"`` (of the lifetime), or a whole number of days, hours or minutes: ``"30d"``,
        ``"720h"``, ``"90m"``. Raises ValueError otherwise."""
        text = text.strip()
        if m := re.fullmatch(r"(\d+(?:\.\d+)?)%", text):
            return cls(fraction=float(m.group(1)) / 100)
        if m := re.fullmatch(r"(\d+)([dhm])", text):
            unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
            return cls(period=timedelta(**{unit: int(m.group(1))}))
        raise ValueError(f"expected a percentage of the lifetime (33%) or a time (30d, 720h, 90m), got {text!r}")

    @classmethod
    def of(cls, value: RenewBefore | timedelta) -> RenewBefore:
        return value if isinstance(value, RenewBefore) else cls(period=value)

    def due_at(self, cert: x509.Certificate) -> datetime:
        """The moment from which ``cert`` is due."""
        end = cert.not_valid_after_utc
        if self.fraction is not None:
            return end - (end - cert.not_valid_before_utc) * self.fraction
        assert self.period is not None
        return end - self.period

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.fraction * 100:g}%"
        assert self.period is not None
        seconds = int(self.period.total_seconds())
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds % size == 0:
                return f"{seconds // size}{unit}"
        return f"{seconds}s"


# The last third of a certificate's life, for serving certificates and CAs alike (cert-manager's
# default point too): with a daily renewal run that is months of retries before anything expires.
RENEW_BEFORE = RenewBefore(fraction=1 / 3)
CA_RENEW_BEFORE = RenewBefore(fraction=1 / 3)


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA certificate, a serving certificate and its key, and (when we own the CA)
    the CA's key. ``repr``/``str`` show the serial and expiry only — never key material."""

    ca_cert: bytes
    cert: bytes
    key: bytes = field(repr=False)
    ca_key: bytes | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        try:
            cert = x509.load_pem_x509_certificate(self.cert)
            about = f"serial={cert.serial_number:x}, not_after={cert.not_valid_after_utc.isoformat()}"
        except _BAD_PEM:
            about = "cert=<unreadable>"
        owned = "yes" if self.ca_key is not None else "no"
        return f"CertBundle({about}, ca_key_held={owned}, keys=<redacted>)"

    __str__ = __repr__


def default_sans(service: str = "volcano-job-webhook", namespace: str = "volcano-job-webhook") -> tuple[list[str], list[str]]:
    """The serving certificate's names: ``(dns_names, ips)``.

    Loopback (``localhost``, ``127.0.0.1``, ``::1``) for local runs and port-forwards, and every name
    the Service answers to in-cluster; the API server calls ``SERVICE.NAMESPACE.svc``.
    """
    dns = [
        "localhost",
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    return dns, ["127.0.0.1", "::1"]


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # ECDSA P-256 rather than RSA 2048: equal-or-better strength (~128-bit vs ~112-bit) with a 32-byte
    # key, much cheaper to generate (no multi-second prime search at startup) and to sign handshakes
    # with, and P-256 is accepted by every TLS stack the API server (Go crypto/tls) or kubectl use.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def generate_ca(common_name: str = "volcano-job-webhook-ca", days: int = CA_DAYS, *,
                now: datetime | None = None) -> tuple[bytes, bytes]:
    """A new self-signed CA: ``(cert PEM, key PEM)``, valid ``days`` from ``now``.

    basicConstraints CA:true (critical, pathLen 0: it signs leaf certificates only), keyUsage
    keyCertSign + cRLSign (critical), and a SubjectKeyIdentifier that issued certificates point to.
    """
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now(now) - BACKDATE
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def _common_name(dns_names: Sequence[str], ips: Sequence[str]) -> str:
    # Verifiers use the SANs only; the CN is for humans reading the cert. Prefer the in-cluster
    # name, but it must fit the 64-character limit (a long Service.Namespace easily exceeds it).
    for candidate in (*reversed(list(dns_names)), *ips):
        if 0 < len(candidate) <= _CN_MAX:
            return candidate
    return "volcano-job-webhook"


def _authority_key_id(ca: x509.Certificate, signer: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> x509.AuthorityKeyIdentifier:
    # Chain builders match the AKI against the issuer's SKI: copy the CA's SKI when it has one
    # (a CA made elsewhere may compute it differently), else derive it from the CA's public key.
    try:
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def generate_serving_cert(
    ca_cert: bytes,
    ca_key: bytes,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    days: int = SERVING_DAYS,
    *,
    now: datetime | None = None,
) -> tuple[bytes, bytes]:
    """A new serving certificate and key signed by the CA (PEM bytes each): ``(cert PEM, key PEM)``.

    SANs are ``dns_names`` and ``ip_addresses``; extendedKeyUsage serverAuth; keyUsage
    digitalSignature (ECDSA keys sign the handshake; keyEncipherment only means something for RSA key
    transport and is added only for an RSA key); CA:false; an AuthorityKeyIdentifier naming the CA.
    The certificate never outlives its CA: ``not_after`` is capped at the CA's.

    Raises ValueError when no names are given, an IP does not parse, or the CA PEMs do not load.
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    if not isinstance(signer, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise ValueError("the CA key must be an EC or RSA private key")
    key = _new_key()
    public = key.public_key()
    start = _now(now) - BACKDATE
    end = min(start + timedelta(days=days), ca.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    is_rsa = isinstance(public, rsa.RSAPublicKey)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _common_name(dns_names, ip_addresses))]))
        .issuer_name(ca.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=is_rsa,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_authority_key_id(ca, signer), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(signer, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def needs_renewal(cert_pem: bytes, renew_before: RenewBefore | timedelta = RENEW_BEFORE, now: datetime | None = None) -> bool:
    """True when the certificate is due at ``now`` (see :class:`RenewBefore`; a ``timedelta`` is a
    fixed period before expiry), has expired, or is not valid yet. Raises ValueError when
    ``cert_pem`` is not a PEM certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    at = _now(now)
    return RenewBefore.of(renew_before).due_at(cert) <= at or cert.not_valid_after_utc <= at or cert.not_valid_before_utc > at


def is_valid(cert_pem: bytes, now: datetime | None = None) -> bool:
    """True while ``now`` is within the certificate's validity. Never raises for bad input."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except _BAD_PEM:
        return False
    return cert.not_valid_before_utc <= _now(now) < cert.not_valid_after_utc


def split_pems(bundle: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as its own PEM (what a ``caBundle`` or ``ca.crt``
    holding several CAs is made of). Raises ValueError when there is none or one does not load."""
    return [_cert_pem(c) for c in x509.load_pem_x509_certificates(bundle)]


def join_pems(certs: Sequence[bytes]) -> bytes:
    """One PEM bundle of ``certs`` (each a PEM), without duplicates, in the order given."""
    seen: list[bytes] = []
    for pem in certs:
        for one in split_pems(pem):
            if one not in seen:
                seen.append(one)
    return b"".join(seen)


def cert_covers(cert_pem: bytes, dns_names: Sequence[str], ips: Sequence[str]) -> bool:
    """True when every one of ``dns_names`` (compared case-insensitively, as DNS is) and ``ips``
    (compared as addresses, so ``::1`` equals ``0:0::1``) is a SAN of the certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return not dns_names and not ips
    have_dns = {d.lower() for d in sans.get_values_for_type(x509.DNSName)}
    have_ips = set(sans.get_values_for_type(x509.IPAddress))
    return {d.lower() for d in dns_names} <= have_dns and {ipaddress.ip_address(ip) for ip in ips} <= have_ips


def issuer_in(cert_pem: bytes, ca_bundle: bytes) -> bytes | None:
    """The CA certificate (PEM) of ``ca_bundle`` whose key signed ``cert`` and whose subject is its
    issuer (cryptography checks both), or None."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in x509.load_pem_x509_certificates(ca_bundle):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return _cert_pem(ca)
    return None


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, password=None)
    cert = x509.load_pem_x509_certificate(cert_pem)
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*der) == cert.public_key().public_bytes(*der)


def _is_ca(cert_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def ca_is_usable(ca_cert: bytes, ca_key: bytes, renew_before: RenewBefore | timedelta = CA_RENEW_BEFORE, now: datetime | None = None) -> bool:
    """True when the pair can keep issuing: it loads, the key is the certificate's, the certificate
    is a CA, and it is not due for renewal (``renew_before``; ``timedelta(0)``: not expired). Never
    raises for bad input."""
    try:
        return _is_ca(ca_cert) and key_matches(ca_cert, ca_key) and not needs_renewal(ca_cert, renew_before, now)
    except _BAD_PEM:
        return False


def bundle_is_good(bundle: CertBundle, dns_names: Sequence[str], ips: Sequence[str],
                   renew_before: RenewBefore | timedelta = RENEW_BEFORE, now: datetime | None = None,
                   ca_renew_before: RenewBefore | timedelta = CA_RENEW_BEFORE) -> bool:
    """True when the bundle can keep being served: the key is the certificate's, a CA of ``ca.crt``
    signed it, it covers ``dns_names`` and ``ips``, it is not due (``renew_before``) and neither is
    that CA (``ca_renew_before``). Unreadable PEMs make it False; it never raises for bad input."""
    try:
        issuer = issuer_in(bundle.cert, bundle.ca_cert)
        return (
            issuer is not None
            and key_matches(bundle.cert, bundle.key)
            and cert_covers(bundle.cert, dns_names, ips)
            and not needs_renewal(bundle.cert, renew_before, now)
            and not needs_renewal(issuer, ca_renew_before, now)
        )
    except _BAD_PEM:
        return False


def serves_until(bundle: CertBundle, now: datetime | None = None) -> datetime | None:
    """The serving certificate's ``notAfter`` when the bundle can be served at ``now`` at all — the
    key is the certificate's, a CA of ``ca.crt`` signed it, both are within their validity — else
    None. For a bundle someone else renews (cert-manager, the certs CronJob): how long it is still
    good for, whatever its renewal window. Never raises for bad input."""
    try:
        issuer = issuer_in(bundle.cert, bundle.ca_cert)
        if issuer is None or not key_matches(bundle.cert, bundle.key):
            return None
        if not (is_valid(bundle.cert, now) and is_valid(issuer, now)):
            return None
        return x509.load_pem_x509_certificate(bundle.cert).not_valid_after_utc
    except _BAD_PEM:
        return None


def issue_bundle(
    existing: CertBundle | None,
    dns_names: Sequence[str],
    ips: Sequence[str],
    *,
    renew_before: RenewBefore | timedelta = RENEW_BEFORE,
    ca_renew_before: RenewBefore | timedelta = CA_RENEW_BEFORE,
    now: datetime | None = None,
    ca: tuple[bytes, bytes] | None = None,
) -> tuple[CertBundle, bool]:
    """``(existing, False)`` when ``existing`` is still good (see :func:`bundle_is_good`), else
    ``(new bundle, True)``.

    The new serving certificate is signed by the first usable CA (see :func:`ca_is_usable`) of:
    ``existing``'s own CA pair, then ``ca`` (a ``(cert PEM, key PEM)`` found without a serving
    certificate, e.g. a certs directory whose ``tls.*`` files were deleted); only when neither is
    usable is a new CA made — the one case where the trust anchor (``caBundle``) changes. Pure: it
    reads no files and talks to no cluster.
    """
    if existing is not None and bundle_is_good(existing, dns_names, ips, renew_before, now, ca_renew_before):
        return existing, False
    candidates = [ca] if ca is not None else []
    if existing is not None and existing.ca_key is not None:
        candidates.insert(0, (existing.ca_cert, existing.ca_key))
    ca_cert, ca_key = next(
        (pair for pair in candidates if ca_is_usable(*pair, renew_before=ca_renew_before, now=now)), (None, None)
    )
    if ca_cert is None or ca_key is None:
        ca_cert, ca_key = generate_ca(now=now)
    cert, key = generate_serving_cert(ca_cert, ca_key, dns_names, ips, now=now)
    return CertBundle(ca_cert=ca_cert, cert=cert, key=key, ca_key=ca_key), True


