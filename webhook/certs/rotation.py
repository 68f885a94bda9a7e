"""The life of a self-managed CA and its serving certificate: what one run of ``certs --secret``
decides, as a pure function of what the cluster holds and the time (:func:`plan`).

Two Secrets hold the state. The CA Secret (:class:`Authority`) holds the CA that signs serving
certificates with its key, and — only during a CA rotation — the next CA (announced, not yet
signing) or the retired ones (still trusted, no key). It is read by the certs Job and CronJob only.
The serving Secret holds ``tls.crt``, ``tls.key`` and ``ca.crt``: the trust bundle, the certificates
of every CA above, which is also what the webhook configurations' ``caBundle`` is set to. No private
key of a CA is ever in the serving Secret, which the network-facing webhook Pods mount.

A run at time ``now`` moves at most one step on each line:

* **serving certificate**: kept while its key matches, the current CA signed it, it covers the
  names and it is not due (``Policy.renew_before``); else a new one is signed by the current CA.
* **CA rotation**, started when the current CA is due (``Policy.ca_renew_before``, by default the
  last third of its ten years):

  1. *announce*: a new CA is made and put in the trust bundle beside the current one; the serving
     certificate is left alone. Clients learn to trust the new CA before anything is signed by it.
  2. *switch*: on a later run that finds the next CA already in every published bundle (the
     serving Secret's ``ca.crt`` and each webhook's ``caBundle``) and made at least
     ``Policy.overlap`` ago, it becomes the current CA, the old one is retired (its certificate stays
     in the bundle, its key is dropped) and a serving certificate signed by the new CA is issued.
     The bundle itself does not change in this step.
  3. *retire*: on a later run, once the serving certificate signed by the current CA has been out
     for ``Policy.overlap`` (every webhook Pod has loaded it: the kubelet updates a mounted Secret
     within a minute or two, the webhook looks every 10 s), the retired CAs leave the bundle.

  With the daily CronJob each step is a day apart; at no point does any client hold a bundle that
  lacks the CA of a certificate being served.
* **recovery**: a current CA that is missing, expired or broken (say, the CA Secret was deleted) is
  replaced at once by the next CA if there is one, else by a new CA, and the serving certificate is
  re-signed. The CAs of the old bundle that are still valid stay in it until the new serving
  certificate has been out for the overlap, so Pods still serving the old certificate are trusted
  meanwhile — that is the one case where the API server sees a new CA and a certificate it signed
  in the same run, and why the caller patches the webhooks before it writes the serving Secret.

The old layout (before the CA Secret existed: ``ca.key`` inside the serving Secret) is read by
:func:`authority_from_serving`; the caller then writes the CA Secret and the serving Secret without
the key.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from .issue import (
    CA_DAYS,
    CA_RENEW_BEFORE,
    RENEW_BEFORE,
    SERVING_DAYS,
    CertBundle,
    RenewBefore,
    ca_is_usable,
    cert_covers,
    generate_ca,
    generate_serving_cert,
    is_valid,
    issuer_in,
    join_pems,
    key_matches,
    needs_renewal,
    split_pems,
)

# How long a CA must have been trusted by every client before it signs, and how long a retired CA
# stays trusted after the last certificate it signed was replaced. API servers see a changed
# caBundle within seconds (an informer); the kubelet updates a mounted Secret within a minute or two
# and the webhook looks every 10 s. An hour is far beyond both, and with a daily CronJob each step
# is a day apart anyway.
OVERLAP = timedelta(hours=1)


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
        def about(pem: bytes | None) -> str:
            return "none" if pem is None else _describe(pem)

        return (f"Authority(current={about(self.current.cert if self.current else None)}, "
                f"next={about(self.next.cert if self.next else None)}, retired=[{', '.join(map(_describe, self.retired))}])")


@dataclass(frozen=True)
class Policy:
    """When things are due, and how long they live. Injected whole by tests."""

    renew_before: RenewBefore = RENEW_BEFORE
    ca_renew_before: RenewBefore = CA_RENEW_BEFORE
    overlap: timedelta = OVERLAP
    serving_days: int = SERVING_DAYS
    ca_days: int = CA_DAYS


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Outcome:
    """What the Secrets should hold after this run, and what changed (one line each, for the log)."""

    authority: Authority
    serving: CertBundle  # ca_cert is the trust bundle; ca_key is always None
    changes: tuple[str, ...]


def _load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _describe(pem: bytes) -> str:
    try:
        cert = _load(pem)
    except ValueError:
        return "<unreadable>"
    return f"serial={cert.serial_number:x} not_after={cert.not_valid_after_utc.isoformat()}"


def _der(pem: bytes) -> bytes:
    return _load(pem).public_bytes(serialization.Encoding.DER)


def certificates_of(bundle: bytes | None) -> set[bytes]:
    """The DER of every certificate in a PEM bundle; empty for None or garbage (a bundle nobody can
    read trusts nothing)."""
    if not bundle:
        return set()
    try:
        return {_der(pem) for pem in split_pems(bundle)}
    except ValueError:
        return set()


def authority_from_serving(serving: CertBundle | None, now: datetime) -> Authority:
    """The CA state when there is no CA Secret. The old layout kept ``ca.key`` in the serving
    Secret: that pair is the current CA (whether usable is :func:`plan`'s question). Otherwise (a
    first install, or the CA Secret lost) there is no current CA, and the still-valid CAs of the
    serving Secret's ``ca.crt`` are kept as retired, so Pods serving the old certificate stay trusted
    while the new one rolls out."""
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


def _serving_is_good(serving: CertBundle | None, ca: KeyPair, dns: Sequence[str], ips: Sequence[str],
                     policy: Policy, now: datetime) -> bool:
    if serving is None:
        return False
    try:
        return (issuer_in(serving.cert, ca.cert) is not None and key_matches(serving.cert, serving.key)
                and cert_covers(serving.cert, dns, ips) and not needs_renewal(serving.cert, policy.renew_before, now))
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return False


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
    held when the run started (:func:`certificates_of`, intersected). Pure: new keys are its only
    side effect."""
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
            changes.append(f"made the next CA current ({_describe(current.cert)})")
        else:
            cert, key = generate_ca(days=policy.ca_days, now=at)
            current = KeyPair(cert, key)
            changes.append(f"made a new CA ({_describe(cert)})")
    elif needs_renewal(current.cert, policy.ca_renew_before, at):
        if upcoming is None:
            cert, key = generate_ca(days=policy.ca_days, now=at)
            upcoming = KeyPair(cert, key)
            changes.append(f"announced the next CA ({_describe(cert)}); the current one is due")
        elif _der(upcoming.cert) in published and _load(upcoming.cert).not_valid_before_utc <= at - policy.overlap:
            retired.append(current.cert)
            current, upcoming = upcoming, None
            changes.append(f"switched to the next CA ({_describe(current.cert)})")
    assert current is not None

    serving_kept = _serving_is_good(serving, current, dns_names, ips, policy, at)
    if serving_kept:
        assert serving is not None
        cert, key = serving.cert, serving.key
    else:
        cert, key = generate_serving_cert(current.cert, current.key, dns_names, ips, days=policy.serving_days, now=at)
        changes.append(f"{'renewed' if serving is not None else 'issued'} the serving certificate ({_describe(cert)})")

    active = {_der(p.cert) for p in (current, upcoming) if p is not None}
    candidates: list[bytes] = []
    for pem in retired:
        if _der(pem) not in active and pem not in candidates:
            candidates.append(pem)
    # A retired CA stays trusted until the certificate that replaced the last one it signed has been
    # out for the overlap; an expired one is worth nothing in a bundle.
    settled = serving_kept and _load(cert).not_valid_before_utc <= at - policy.overlap
    kept = [pem for pem in candidates if is_valid(pem, at) and not settled]
    if len(kept) < len(candidates):
        changes.append(f"{len(candidates) - len(kept)} retired CA(s) left the trust bundle")
    result = Authority(current=current, next=upcoming, retired=tuple(kept))
    return Outcome(result, CertBundle(ca_cert=result.bundle(), cert=cert, key=key), tuple(changes))
