"""Certificates for the webhook, made with ``cryptography``: a private CA, serving certificates,
trust bundles of several CAs (during a CA rotation), and when a certificate is due
(:class:`RenewBefore`, within one :class:`Policy`). Pure: a certs directory (:mod:`.files`) and the cluster's Secrets
(:mod:`.rotation`, :mod:`.cluster`) share it. Key material never appears in a ``repr``, a log line
or a message raised here.
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
    """When a certificate is due for renewal: in the last ``fraction`` of its lifetime, or ``period``
    before its ``notAfter`` (exactly one). A fraction suits any lifetime, a certificate cut short to
    its CA's expiry too."""

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
        """``"33%"`` (of the lifetime), or whole days, hours or minutes (``"30d"``, ``"720h"``, ``"90m"``)."""
        text = text.strip()
        if m := re.fullmatch(r"(\d+(?:\.\d+)?)%", text):
            return cls(fraction=float(m.group(1)) / 100)
        if m := re.fullmatch(r"(\d+)([dhm])", text):
            unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
            return cls(period=timedelta(**{unit: int(m.group(1))}))
        raise ValueError(f"expected a percentage of the lifetime (33%) or a time (30d, 720h, 90m), got {text!r}")

    def due_at(self, cert: x509.Certificate) -> datetime:
        end = cert.not_valid_after_utc
        if self.fraction is not None:
            return end - (end - cert.not_valid_before_utc) * self.fraction
        assert self.period is not None
        return end - self.period


# The last third of a certificate's life, for serving certificates and CAs alike (cert-manager's
# default point too): with a daily renewal run that is months of retries before anything expires.
RENEW_BEFORE = RenewBefore(fraction=1 / 3)
CA_RENEW_BEFORE = RenewBefore(fraction=1 / 3)
# How long a CA is trusted by every client before it signs, and a retired one after the last
# certificate it signed was replaced: far beyond an API server's seconds and a kubelet's minutes.
OVERLAP = timedelta(hours=1)


@dataclass(frozen=True)
class Policy:
    """When things are due, and how long they live: one object for a certs directory (:mod:`.files`)
    and the cluster's Secrets (:mod:`.rotation`). Injected whole by tests."""

    renew_before: RenewBefore | timedelta = RENEW_BEFORE
    ca_renew_before: RenewBefore | timedelta = CA_RENEW_BEFORE
    overlap: timedelta = OVERLAP
    serving_days: int = SERVING_DAYS
    ca_days: int = CA_DAYS


DEFAULT_POLICY = Policy()
# Nothing due before it expires: what can still be served at all.
SERVABLE = Policy(renew_before=timedelta(0), ca_renew_before=timedelta(0))


@dataclass(frozen=True)
class CertBundle:
    """What a ``kubernetes.io/tls`` Secret holds, as PEM (``ca_cert`` may be a trust bundle), and
    the CA's key when we own the CA. ``repr`` shows the serial and expiry only, never key material."""

    ca_cert: bytes
    cert: bytes
    key: bytes = field(repr=False)
    ca_key: bytes | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        owned = "yes" if self.ca_key is not None else "no"
        return f"CertBundle({describe(self.cert)}, ca_key_held={owned}, keys=<redacted>)"


def describe(cert_pem: bytes, *, names: bool = False) -> str:
    """Serial and expiry of a PEM certificate (``names``: whether it has expired, and its SANs): what a
    log line may say of it."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except _BAD_PEM:
        return "<unreadable>"
    text = f"serial={cert.serial_number:x} not_after={cert.not_valid_after_utc.isoformat()}"
    if not names:
        return text
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        listed = ",".join(str(v) for v in (*sans.get_values_for_type(x509.DNSName), *sans.get_values_for_type(x509.IPAddress)))
    except x509.ExtensionNotFound:
        listed = ""
    return f"{text}{' (EXPIRED)' if cert.not_valid_after_utc <= datetime.now(UTC) else ''} sans={listed}"


def default_sans(service: str = "volcano-job-webhook", namespace: str = "volcano-job-webhook") -> tuple[list[str], list[str]]:
    """The serving certificate's names, ``(dns_names, ips)``: loopback for local runs and
    port-forwards, and every name the Service answers to (the API server calls ``SERVICE.NAMESPACE.svc``)."""
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
    # ECDSA P-256 rather than RSA: as strong, far cheaper to generate and to sign handshakes with,
    # and accepted by every TLS stack the API server (Go crypto/tls) or kubectl use.
    return ec.generate_private_key(ec.SECP256R1())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _signed(subject: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
            start: datetime, end: datetime, extensions: Sequence[tuple[x509.ExtensionType, bool]]) -> tuple[bytes, bytes]:
    """``(cert PEM, key PEM)``: ``key``'s certificate for ``subject`` (a common name), signed by ``signer``
    as ``issuer`` (None: self-signed), with each ``(extension, critical)`` and its SubjectKeyIdentifier."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end))
    for extension, critical in [*extensions, (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)]:
        builder = builder.add_extension(extension, critical=critical)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return _cert_pem(builder.sign(signer, hashes.SHA256())), pem


def _key_usage(**allowed: bool) -> x509.KeyUsage:
    """A KeyUsage of only the uses named."""
    uses = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
            "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
    return x509.KeyUsage(**{use: allowed.get(use, False) for use in uses})


def generate_ca(common_name: str = "volcano-job-webhook-ca", days: int = CA_DAYS, *,
                now: datetime | None = None) -> tuple[bytes, bytes]:
    """A new self-signed CA, ``(cert PEM, key PEM)``, valid ``days`` from ``now``; pathLen 0: it
    signs leaf certificates only."""
    key = _new_key()
    start = _now(now) - BACKDATE
    return _signed(common_name, None, key, key, start, start + timedelta(days=days), [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (_key_usage(key_cert_sign=True, crl_sign=True), True),
    ])


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
    """A new serving certificate and key signed by the CA, ``(cert PEM, key PEM)``, for
    ``dns_names`` and ``ip_addresses``; it never outlives its CA. Raises ValueError when no names
    are given, an IP does not parse, or the CA PEMs do not load."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    if not isinstance(signer, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise ValueError("the CA key must be an EC or RSA private key")
    start = _now(now) - BACKDATE
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    return _signed(_common_name(dns_names, ip_addresses), ca.subject, _new_key(), signer, start,
                   min(start + timedelta(days=days), ca.not_valid_after_utc), [
        (x509.SubjectAlternativeName(sans), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_key_usage(digital_signature=True), True),  # an EC key: no key_encipherment
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (_authority_key_id(ca, signer), False),
    ])


def needs_renewal(cert_pem: bytes, renew_before: RenewBefore | timedelta = RENEW_BEFORE, now: datetime | None = None) -> bool:
    """True when the certificate is due at ``now`` (a ``timedelta``: that long before expiry), or
    not valid then. Raises ValueError when ``cert_pem`` is not a PEM certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    window = renew_before if isinstance(renew_before, RenewBefore) else RenewBefore(period=renew_before)
    return not cert.not_valid_before_utc <= _now(now) < window.due_at(cert)


def is_valid(cert_pem: bytes, now: datetime | None = None) -> bool:
    """True while ``now`` is within the certificate's validity. Never raises for bad input."""
    try:
        return not needs_renewal(cert_pem, timedelta(0), now)
    except _BAD_PEM:
        return False


def split_pems(bundle: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as its own PEM. Raises ValueError when there is none
    or one does not load."""
    return [_cert_pem(c) for c in x509.load_pem_x509_certificates(bundle)]


def join_pems(certs: Sequence[bytes]) -> bytes:
    """One PEM bundle of ``certs`` (each a PEM), without duplicates, in the order given."""
    return b"".join(dict.fromkeys(one for pem in certs for one in split_pems(pem)))


def cert_covers(cert_pem: bytes, dns_names: Sequence[str], ips: Sequence[str]) -> bool:
    """True when every one of ``dns_names`` (case-insensitively) and ``ips`` (as addresses) is a
    SAN of the certificate."""
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
    """True when the pair can keep issuing: the key is the certificate's, which is a CA not due
    (``timedelta(0)``: not expired). Never raises for bad input."""
    try:
        return _is_ca(ca_cert) and key_matches(ca_cert, ca_key) and not needs_renewal(ca_cert, renew_before, now)
    except _BAD_PEM:
        return False


def bundle_is_good(bundle: CertBundle, dns_names: Sequence[str], ips: Sequence[str], policy: Policy = DEFAULT_POLICY,
                   now: datetime | None = None) -> bool:
    """True when the bundle can keep being served: the key is the certificate's, a CA of ``ca_cert``
    signed it, it covers the names, and neither it nor that CA is due. Never raises for bad input."""
    try:
        issuer = issuer_in(bundle.cert, bundle.ca_cert)
        return (
            issuer is not None
            and key_matches(bundle.cert, bundle.key)
            and cert_covers(bundle.cert, dns_names, ips)
            and not needs_renewal(bundle.cert, policy.renew_before, now)
            and not needs_renewal(issuer, policy.ca_renew_before, now)
        )
    except _BAD_PEM:
        return False


def serves_until(bundle: CertBundle, now: datetime | None = None) -> datetime | None:
    """The serving certificate's ``notAfter`` while the bundle can be served at all (due or not: for
    a bundle someone else renews), else None. Never raises for bad input."""
    if not bundle_is_good(bundle, [], [], SERVABLE, now):
        return None
    return x509.load_pem_x509_certificate(bundle.cert).not_valid_after_utc
