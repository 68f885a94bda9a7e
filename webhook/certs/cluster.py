"""The certificates in the cluster: :func:`sync`, one run of ``certs --secret``, reads the serving
Secret, the CA Secret (read by the certs Job and CronJob only) and the webhook configurations, lets
:func:`.rotation.plan` decide, and writes what changed, in an order that keeps every client trusting
the served certificate: the CA Secret (a new key stored before anything depends on it), every
webhook's ``caBundle``, then the serving Secret. Each write is conditional on the
``resourceVersion`` read, so of two runs at once the later fails with a conflict and retries. A
serving Secret of the old layout (``ca.key`` inside) is migrated.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL
from volcano_job_webhook.plugins.kinds import SECRET, Kind

from .issue import CA_CERT, CA_KEY, DEFAULT_POLICY, TLS_CERT, TLS_KEY, CertBundle, Policy, default_sans, is_valid, split_pems
from .rotation import Authority, KeyPair, Outcome, authority_from_serving, certificates_of, plan

log = logging.getLogger(__name__)

# The CA Secret's keys: each pair by its role in an Authority (the signing CA, the next one during a
# rotation), and the retired CA certificates.
PAIR_KEYS = {"current": (CA_CERT, CA_KEY), "next": ("next-ca.crt", "next-ca.key")}
RETIRED_CA_CERTS = "retired-ca.crt"
TLS_SECRET_TYPE = "kubernetes.io/tls"
# Not the managed-by label of the reconciler's objects: the reconciler caches every Secret with that
# label, and the CA key has no business in its memory.
CA_SECRET_LABELS = {
    "app.kubernetes.io/name": "volcano-job-webhook",
    "app.kubernetes.io/component": "certgen",
    "app.kubernetes.io/part-of": "volcano-job-webhook",
}
# The webhook configurations, by kind: what this module patches and the registration applies.
WEBHOOK_CONFIGURATIONS = {
    name: Kind("admissionregistration.k8s.io", "v1", name, f"{name.lower()}s", name)
    for name in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
}


class CertsError(Exception):
    """The cluster is not as ``certs`` needs it (say, the webhook configuration is not there yet)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _decoded(secret: dict[str, Any]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue  # an undecodable entry counts as absent
    return out


def serving_bundle(secret: dict[str, Any]) -> CertBundle | None:
    """The bundle in a serving Secret (``ca_key`` set only for the old layout), or None when
    ``tls.crt``, ``tls.key`` or ``ca.crt`` is missing."""
    data = _decoded(secret)
    if not all(k in data for k in (CA_CERT, TLS_CERT, TLS_KEY)):
        return None
    return CertBundle(ca_cert=data[CA_CERT], cert=data[TLS_CERT], key=data[TLS_KEY], ca_key=data.get(CA_KEY))


def authority_of(secret: dict[str, Any]) -> Authority:
    """What a CA Secret holds; a pair with a part missing counts as absent (plan() then decides)."""
    data = _decoded(secret)
    pairs = {role: KeyPair(data[cert], data[key]) for role, (cert, key) in PAIR_KEYS.items() if cert in data and key in data}
    try:
        retired = tuple(split_pems(data[RETIRED_CA_CERTS])) if data.get(RETIRED_CA_CERTS) else ()
    except ValueError:
        retired = ()
    return Authority(**pairs, retired=retired)


def authority_data(authority: Authority) -> dict[str, bytes | str]:
    """The CA Secret's ``data`` for ``authority`` (base64, as the API wants it)."""
    data: dict[str, bytes] = {}
    for role, (cert, key) in PAIR_KEYS.items():
        if (pair := getattr(authority, role)) is not None:
            data[cert], data[key] = pair.cert, pair.key
    if authority.retired:
        data[RETIRED_CA_CERTS] = b"".join(authority.retired)
    return {k: _b64(v) for k, v in data.items()}  # the API takes base64 text


@dataclass(frozen=True)
class WebhookConfig:
    kind: str
    name: str
    resource_version: str
    bundles: tuple[str | None, ...]  # caBundle (base64) of each webhook, in order


def read_webhooks(rest: Rest, name: str) -> list[WebhookConfig]:
    """Both configurations named ``name`` as found; CertsError when neither exists (yet)."""
    found = []
    for kind, resource in WEBHOOK_CONFIGURATIONS.items():
        config = rest.get(resource, "", name)
        if config is None:
            continue
        bundles = tuple((hook.get("clientConfig") or {}).get("caBundle") for hook in config.get("webhooks") or [])
        found.append(WebhookConfig(kind, name, config["metadata"]["resourceVersion"], bundles))
    if not found:
        raise CertsError(f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name!r} (yet)")
    return found


def patch_webhooks(rest: Rest, configs: list[WebhookConfig], ca_bundle: bytes) -> list[str]:
    """Set ``caBundle`` on every webhook of ``configs`` where it differs; the kinds patched. Each patch
    tests the ``resourceVersion`` read first: a configuration changed since is not overwritten."""
    wanted = _b64(ca_bundle)
    patched = []
    for config in configs:
        if all(b == wanted for b in config.bundles):
            continue
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": config.resource_version}]
        ops += [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted} for i in range(len(config.bundles))]
        rest.json_patch(WEBHOOK_CONFIGURATIONS[config.kind], "", config.name, ops)
        patched.append(config.kind)
        log.info("set caBundle on %s %s", config.kind, config.name)
    return patched


def _write(rest: Rest, found: dict[str, Any] | None, namespace: str, name: str, labels: dict[str, str], secret_type: str,
           data: dict[str, bytes | str]) -> bool:
    """Create Secret ``namespace/name``, or replace ``found``'s data where it differs (with its
    ``resourceVersion``: a race gets 409); whether it was written."""
    if found is None:
        rest.create(SECRET, namespace, {"apiVersion": "v1", "kind": "Secret", "type": secret_type, "data": data,
                                        "metadata": {"name": name, "namespace": namespace, "labels": labels}})
        log.info("created Secret %s/%s", namespace, name)
    elif (found.get("data") or {}) != data:
        rest.replace(SECRET, {**found, "data": data})
        log.info("updated Secret %s/%s", namespace, name)
    else:
        return False
    return True


@dataclass(frozen=True)
class SyncResult:
    outcome: Outcome
    ca_written: bool
    serving_written: bool
    patched: list[str]


def _pems(bundle: str | None) -> list[bytes]:
    """The certificates of a base64 ``caBundle``; none for an absent or unreadable one."""
    try:
        return split_pems(base64.b64decode(bundle)) if bundle else []
    except ValueError:
        return []


def _published(serving_secret: dict[str, Any] | None, configs: list[WebhookConfig]) -> set[bytes]:
    """The CA certificates every client already trusts: in the serving Secret's ``ca.crt`` and in
    every webhook's ``caBundle``."""
    trusted = certificates_of(_decoded(serving_secret).get(CA_CERT)) if serving_secret is not None else set()
    for config in configs:
        for bundle in config.bundles:
            trusted &= certificates_of(b"".join(_pems(bundle)))
    return trusted


def sync(
    api: client.ApiClient,
    namespace: str,
    name: str,
    ca_name: str,
    service: str,
    service_namespace: str,
    *,
    webhook: str | None = None,
    policy: Policy = DEFAULT_POLICY,
    now: datetime | None = None,
) -> SyncResult:
    """One run of ``certs --secret NAMESPACE/NAME --ca-secret CA_NAME [--patch-webhook WEBHOOK]``
    (see the module's text)."""
    if ca_name == name:
        raise CertsError("the CA Secret must not be the serving Secret: the webhook Pods mount the serving Secret")
    at = now if now is not None else datetime.now(UTC)
    rest = Rest(api)
    secret = rest.get(SECRET, namespace, name)
    ca_secret = rest.get(SECRET, namespace, ca_name)
    configs = read_webhooks(rest, webhook) if webhook else []
    if secret is not None and secret.get("type") != TLS_SECRET_TYPE:
        raise CertsError(f"Secret {namespace}/{name} is of type {secret.get('type')!r}, not {TLS_SECRET_TYPE} (the type cannot change; delete it)")
    serving = serving_bundle(secret) if secret is not None else None
    authority = authority_of(ca_secret) if ca_secret is not None else Authority()
    if authority.current is None:
        # No signing CA yet: the serving Secret may hold one (the old layout), and the CAs the webhooks
        # trust now stay trusted while a new CA's certificate rolls out, so losing both Secrets refuses no Pod.
        found = authority_from_serving(serving, at)
        trusted = [pem for config in configs for bundle in config.bundles for pem in _pems(bundle) if is_valid(pem, at)]
        authority = Authority(current=found.current, next=authority.next, retired=(*authority.retired, *found.retired, *trusted))
        if found.current is not None:
            log.info("Secret %s/%s holds the CA key (the old layout): moving it to Secret %s/%s", namespace, name, namespace, ca_name)
    dns, ips = default_sans(service, service_namespace)
    outcome = plan(authority, serving, dns, ips, published=_published(secret, configs), policy=policy, now=at)
    for change in outcome.changes:
        log.info("%s", change)

    ca_written = _write(rest, ca_secret, namespace, ca_name, dict(CA_SECRET_LABELS), "Opaque", authority_data(outcome.authority))
    patched = patch_webhooks(rest, configs, outcome.serving.ca_cert) if configs else []
    # Without ca.key: a Secret of the old layout loses it here.
    serving_written = _write(rest, secret, namespace, name, {MANAGED_BY_LABEL: MANAGED_BY}, TLS_SECRET_TYPE,
                             {TLS_CERT: _b64(outcome.serving.cert), TLS_KEY: _b64(outcome.serving.key), CA_CERT: _b64(outcome.serving.ca_cert)})
    return SyncResult(outcome, ca_written, serving_written, patched)
