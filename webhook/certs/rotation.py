"""One run of ``certs --secret`` as a pure function (:func:`plan`) of the CA Secret
(:class:`Authority`), the serving Secret, what every client already trusts, and the time.

A run moves at most one step: a due serving certificate is renewed under the current CA; a due CA is
rotated over three runs (docs/install.md, Certificates) — a next CA is *announced* in the trust
bundle, made current once it is in every published bundle and ``Policy.overlap`` old, and the old one
*retired* from the bundle once the certificate it signed has been replaced for the overlap — so no
client ever lacks the CA of a certificate being served. A current CA that is missing or broken is
replaced at once, the old bundle's valid CAs staying trusted for the overlap: the one case where the
API server sees a new CA and its certificate in one run, so the caller patches the webhooks before
it writes the serving Secret. No CA key is ever in the serving Secret, which the webhook Pods read.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .issue import (
    DEFAULT_POLICY,
    CertBundle,
    Policy,
    bundle_is_good,
    ca_is_usable,
    describe,
    generate_ca,
    generate_serving_cert,
    is_valid,
    join_pems,
    needs_renewal,
    split_pems,
)


@dataclass(frozen=True)
class KeyPair:
    """A CA certificate and its private key (PEM). ``repr`` never shows the key."""

    cert: bytes
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class Authority:
    """What the CA Secret holds: the CA that signs (``current``), the one announced to replace it
    (``next``, during a rotation) and retired CA certificates still trusted (``retired``, PEMs)."""

    current: KeyPair | None = None
    next: KeyPair | None = None
    retired: tuple[bytes, ...] = ()

    def bundle(self) -> bytes:
        """The trust bundle: retired CAs, the current one, the next one — oldest first, so a step
        that only moves a CA from one role to the next leaves the bytes unchanged."""
        return join_pems([*self.retired, *(p.cert for p in (self.current, self.next) if p is not None)])

    def __repr__(self) -> str:
        def about(pair: KeyPair | None) -> str:
            return "none" if pair is None else describe(pair.cert)

        return f"Authority(current={about(self.current)}, next={about(self.next)}, retired=[{', '.join(map(describe, self.retired))}])"


@dataclass(frozen=True)
class Outcome:
    """What the Secrets should hold after this run, and what changed (one line each, for the log)."""

    authority: Authority
    serving: CertBundle  # ca_cert is the trust bundle; ca_key is always None
    changes: tuple[str, ...]


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def certificates_of(bundle: bytes | None) -> set[bytes]:
    """The DER of every certificate in a PEM bundle; none for None or garbage (trusting nothing)."""
    if not bundle:
        return set()
    try:
        return {_der(pem) for pem in split_pems(bundle)}
    except ValueError:
        return set()


def authority_from_serving(serving: CertBundle | None, now: datetime) -> Authority:
    """The CA state when there is no CA Secret: the old layout's ``ca.key`` in the serving Secret
    makes its pair current; otherwise there is none, and the still-valid CAs of ``ca.crt`` stay
    trusted (retired) while a new certificate rolls out."""
    if serving is None:
        return Authority()
    try:
        cas = split_pems(serving.ca_cert)
    except ValueError:
        cas = []
    if serving.ca_key is not None and cas:
        return Authority(current=KeyPair(cas[0], serving.ca_key), retired=tuple(c for c in cas[1:] if is_valid(c, now)))
    return Authority(retired=tuple(c for c in cas if is_valid(c, now)))


def _usable(pair: KeyPair | None, now: datetime) -> bool:
    return pair is not None and ca_is_usable(pair.cert, pair.key, timedelta(0), now)


def plan(
    authority: Authority,
    serving: CertBundle | None,
    dns_names: Sequence[str],
    ips: Sequence[str],
    *,
    published: Collection[bytes] = frozenset(),
    policy: Policy = DEFAULT_POLICY,
    now: datetime | None = None,
) -> Outcome:
    """One run's decisions (see the module's text). ``serving`` is the serving Secret as found
    (``ca_key`` ignored); ``published`` the DER of every CA certificate that every client's bundle
    held when the run started (:func:`certificates_of`, intersected)."""
    at = now if now is not None else datetime.now(UTC)
    changes: list[str] = []
    current, upcoming, retired = authority.current, authority.next, list(authority.retired)

    if upcoming is not None and not _usable(upcoming, at):
        changes.append("dropped an unusable next CA")
        upcoming = None
    if current is None or not _usable(current, at):
        if current is not None:
            changes.append("the current CA is expired or unusable")
            retired.append(current.cert)
        if upcoming is not None:
            current, upcoming = upcoming, None
            changes.append(f"made the next CA current ({describe(current.cert)})")
        else:
            cert, key = generate_ca(days=policy.ca_days, now=at)
            current = KeyPair(cert, key)
            changes.append(f"made a new CA ({describe(cert)})")
    elif needs_renewal(current.cert, policy.ca_renew_before, at):
        if upcoming is None:
            cert, key = generate_ca(days=policy.ca_days, now=at)
            upcoming = KeyPair(cert, key)
            changes.append(f"announced the next CA ({describe(cert)}); the current one is due")
        elif _der(upcoming.cert) in published and x509.load_pem_x509_certificate(upcoming.cert).not_valid_before_utc <= at - policy.overlap:
            retired.append(current.cert)
            current, upcoming = upcoming, None
            changes.append(f"switched to the next CA ({describe(current.cert)})")
    assert current is not None

    # The current CA is valid now, so its own window (timedelta(0)) changes nothing.
    serving_kept = serving is not None and bundle_is_good(replace(serving, ca_cert=current.cert), dns_names, ips,
                                                          replace(policy, ca_renew_before=timedelta(0)), at)
    if serving_kept:
        assert serving is not None
        cert, key = serving.cert, serving.key
    else:
        cert, key = generate_serving_cert(current.cert, current.key, dns_names, ips, days=policy.serving_days, now=at)
        changes.append(f"{'renewed' if serving is not None else 'issued'} the serving certificate ({describe(cert)})")

    active = {_der(p.cert) for p in (current, upcoming) if p is not None}
    candidates = list(dict.fromkeys(pem for pem in retired if _der(pem) not in active))
    # A retired CA stays trusted until the certificate that replaced the last one it signed has been
    # out for the overlap; an expired one is worth nothing in a bundle.
    settled = serving_kept and x509.load_pem_x509_certificate(cert).not_valid_before_utc <= at - policy.overlap
    kept = [pem for pem in candidates if is_valid(pem, at) and not settled]
    if len(kept) < len(candidates):
        changes.append(f"{len(candidates) - len(kept)} retired CA(s) left the trust bundle")
    result = Authority(current=current, next=upcoming, retired=tuple(kept))
    return Outcome(result, CertBundle(ca_cert=result.bundle(), cert=cert, key=key), tuple(changes))
