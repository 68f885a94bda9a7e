"""The certificate in the cluster: a ``kubernetes.io/tls`` Secret, and the webhook registrations' CA.

:func:`sync_secret` keeps a Secret holding ``tls.crt``, ``tls.key``, ``ca.crt`` (and ``ca.key``, so
the CA survives renewals); :func:`patch_webhooks` sets that CA as the ``caBundle`` of every webhook of
the Mutating- and ValidatingWebhookConfiguration of one name — like kube-webhook-certgen, and
idempotent: a valid certificate is kept, one close to expiry is renewed, nothing is written when
nothing changes.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL

from .issue import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CertBundle, default_sans, issue_bundle

log = logging.getLogger(__name__)


class CertsError(Exception):
    """The cluster is not as ``certs`` needs it (say, the webhook configuration is not there yet)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bundle_from_secret(secret: Any) -> CertBundle | None:
    data = secret.data or {}
    try:
        return CertBundle(
            ca_cert=base64.b64decode(data[CA_CERT]),
            cert=base64.b64decode(data[TLS_CERT]),
            key=base64.b64decode(data[TLS_KEY]),
            ca_key=base64.b64decode(data[CA_KEY]) if CA_KEY in data else None,
        )
    except (KeyError, ValueError, TypeError):
        return None


def sync_secret(api: client.ApiClient, namespace: str, name: str, service: str, service_namespace: str) -> tuple[CertBundle, bool]:
    """Create or renew the TLS Secret; returns the bundle in it and whether the Secret was written."""
    core = client.CoreV1Api(api)
    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        secret = None
    dns, ips = default_sans(service, service_namespace)
    existing = _bundle_from_secret(secret) if secret is not None else None
    bundle, changed = issue_bundle(existing, dns, ips)
    if not changed:
        return bundle, False
    data: dict[str, bytes | str] = {TLS_CERT: _b64(bundle.cert), TLS_KEY: _b64(bundle.key), CA_CERT: _b64(bundle.ca_cert)}
    if bundle.ca_key is not None:
        data[CA_KEY] = _b64(bundle.ca_key)
    if secret is None:
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace,
                                         labels={MANAGED_BY_LABEL: MANAGED_BY}),
            type="kubernetes.io/tls", data=data,
        )
        core.create_namespaced_secret(namespace, body)
        log.info("created Secret %s/%s", namespace, name)
    else:
        secret.data = data
        core.replace_namespaced_secret(name, namespace, secret)  # carries resourceVersion: a race gets 409
        log.info("renewed the certificate in Secret %s/%s", namespace, name)
    return bundle, True


def patch_webhooks(api: client.ApiClient, name: str, ca_bundle: bytes) -> list[str]:
    """Set ``caBundle`` on every webhook of both configurations named ``name`` where it differs;
    returns the kinds patched. A configuration that does not exist yet is an error (retried by the
    Job that runs this)."""
    admission = client.AdmissionregistrationV1Api(api)
    wanted = _b64(ca_bundle)
    patched, found = [], 0
    for kind, read, patch in (
        ("MutatingWebhookConfiguration", admission.read_mutating_webhook_configuration, admission.patch_mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", admission.read_validating_webhook_configuration, admission.patch_validating_webhook_configuration),
    ):
        try:
            config = read(name)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        found += 1
        hooks = config.webhooks or []
        current = [api.sanitize_for_serialization(h.client_config).get("caBundle") for h in hooks]
        if all(c == wanted for c in current):
            continue
        ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted} for i in range(len(hooks))]
        patch(name, ops)
        patched.append(kind)
        log.info("set caBundle on %s %s", kind, name)
    if not found:
        raise CertsError(f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name!r} (yet)")
    return patched
