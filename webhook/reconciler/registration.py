"""The webhook's registration: the leader applies ``webhook_configurations`` once what they name serves
(a ready endpoint of the Service that its cluster IP routes to, or the URL's ``/readyz``) — registered
earlier, a fail-closed webhook would refuse every Volcano Pod — and keeps them even when the endpoints
go: ``caBundle`` from the serving Secret, drift repaired, owned by the install's ClusterRole so that
deleting it deletes them.
"""

from __future__ import annotations

import base64
import logging
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from volcano_job_webhook.certs.cluster import WEBHOOK_CONFIGURATIONS
from volcano_job_webhook.config import ConfigError
from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import ObjectRecord
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.kinds import SECRET, SERVICE, Kind, ObjectKey

from .compare import covered
from .expectations import Ident
from .manager import Manager
from .metrics import ReconcilerMetrics
from .owned import CLUSTER_ROLE, ENDPOINT_SLICE

log = logging.getLogger(__name__)

REGISTRATION_FIELD_MANAGER = "volcano-job-webhook-registration"
KEY = "registration"
# The certificates' step is due this often; a webhook that does not answer yet is asked again this
# often (kube-proxy programs a new endpoint about a second after it is ready, slower on a busy node).
CERTIFICATES_EVERY = 60.0
PROBE_EVERY = 1.0
# Every change it reads comes by watch: the resync is only a safety net.
RESYNC = 600.0


def load_configurations(path: Path) -> list[dict[str, Any]]:
    """The configurations of ``path`` (a YAML list, or documents), each checked to be one we can register."""
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"webhook_configurations {path}: {exc}") from None
    items = [item for doc in documents for item in (doc if isinstance(doc, list) else [doc]) if item is not None]
    for item in items:
        if not isinstance(item, dict) or item.get("kind") not in WEBHOOK_CONFIGURATIONS or not (item.get("metadata") or {}).get("name"):
            raise ConfigError(f"webhook_configurations {path}: every item must be a named "
                              f"{' or '.join(WEBHOOK_CONFIGURATIONS)}, got {str(item)[:80]!r}")
        for hook in item.get("webhooks") or []:
            client_config = hook.get("clientConfig") or {}
            if ("service" in client_config) == ("url" in client_config):
                raise ConfigError(f"webhook_configurations {path}: webhook {hook.get('name')!r} needs exactly one of "
                                  "clientConfig.service and clientConfig.url")
    if not items:
        raise ConfigError(f"webhook_configurations {path}: no configuration in it")
    return items


def desired(template: dict[str, Any], ca_bundle: bytes, owner: dict[str, Any] | None) -> dict[str, Any]:
    """``template`` as it is registered: every webhook trusting ``ca_bundle``, owned by ``owner``."""
    bundle = base64.b64encode(ca_bundle).decode()
    metadata = {key: value for key, value in template["metadata"].items() if key in ("name", "labels", "annotations")}
    if owner is not None:
        metadata["ownerReferences"] = [{"apiVersion": CLUSTER_ROLE.api_version, "kind": CLUSTER_ROLE.kind,
                                        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    webhooks = [{**hook, "clientConfig": {**hook["clientConfig"], "caBundle": bundle}} for hook in template.get("webhooks") or []]
    return {"apiVersion": WEBHOOK_CONFIGURATIONS[template["kind"]].api_version, "kind": template["kind"], "metadata": metadata,
            "webhooks": webhooks}


def targets(templates: Iterable[dict[str, Any]]) -> tuple[set[tuple[ObjectKey, int]], set[str]]:
    """The Services (with the port) and URLs the webhooks of ``templates`` are called at."""
    services: set[tuple[ObjectKey, int]] = set()
    urls: set[str] = set()
    for template in templates:
        for hook in template.get("webhooks") or []:
            client_config = hook["clientConfig"]
            if "service" in client_config:
                service = client_config["service"]
                services.add((ObjectKey(service["namespace"], service["name"]), int(service.get("port") or 443)))
            else:
                urls.add(client_config["url"])
    return services, urls


def has_ready_endpoint(slices: Iterable[dict[str, Any]]) -> bool:
    """Whether any endpoint of ``slices`` takes traffic (an unset ``ready`` counts as ready, as the API documents)."""
    return any((endpoint.get("conditions") or {}).get("ready") is not False and endpoint.get("addresses")
               for piece in slices for endpoint in piece.get("endpoints") or [])


def routed(service: dict[str, Any] | None, port: int, timeout: float = 1.0) -> bool:
    """Whether a connection to ``service``'s cluster IP on ``port`` is taken, as the API server makes it: a
    ready endpoint that kube-proxy has not programmed yet is refused there, and so would every Pod be."""
    address = ((service or {}).get("spec") or {}).get("clusterIP")
    if not address or address == "None":
        return False
    try:
        socket.create_connection((address, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def url_serves(url: str, ca_bundle: bytes, timeout: float = 2.0) -> bool:
    """Whether the server behind ``url`` answers ``/readyz`` with 200 over TLS checked against ``ca_bundle``."""
    parts = urlsplit(url)
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    try:
        with urllib.request.urlopen(f"{parts.scheme}://{parts.netloc}/readyz", context=context, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Registrar:
    """Keeps ``templates`` registered: a controller of one key on ``manager``, woken by the watches of what
    it reads; ``certificates`` (certs.cluster.sync) first when due, as its Secret is what is trusted."""

    def __init__(self, manager: Manager, rest: Rest, templates: list[dict[str, Any]], namespace: str, secret: str, owner: str | None,
                 *, certificates: Callable[[], object] | None = None, metrics: ReconcilerMetrics | None = None) -> None:
        self.rest = rest
        self.templates = templates
        self.certificates = certificates
        self.metrics = metrics
        self._certificates_due = 0.0
        self.registered: set[Ident] = set()
        self.waiting = False

        def named(kind: Kind, name: str, namespace: str = "", transform: Callable[[Any], ObjectRecord] = ObjectRecord) -> Informer[ObjectRecord]:
            return manager.informer(kind, [namespace], transform=transform, field_selector=f"metadata.name={name}")

        # Of the serving Secret only its ca.crt: its key is serve's, not this process's to hold.
        self.secret = named(SECRET, secret, namespace, lambda obj: ObjectRecord({**obj, "data": {"ca.crt": (obj.get("data") or {}).get("ca.crt")}}))
        self.owner = named(CLUSTER_ROLE, owner) if owner is not None else None
        self.live = {(t["kind"], t["metadata"]["name"]): named(WEBHOOK_CONFIGURATIONS[t["kind"]], t["metadata"]["name"])
                     for t in templates}
        services, _ = targets(templates)
        self.slices = {key: manager.informer(ENDPOINT_SLICE, [key.namespace], transform=ObjectRecord,
                                             label_selector=f"kubernetes.io/service-name={key.name}") for key, _ in services}
        self.services = {key: named(SERVICE, key.name, key.namespace) for key, _ in services}
        caches = [self.secret, *([self.owner] if self.owner else []), *self.live.values(), *self.slices.values(), *self.services.values()]
        self.controller = manager.controller("registration", caches, self.reconcile, keys=lambda: [KEY], workers=1,
                                             resync_seconds=RESYNC)
        for cache in caches:
            cache.add_event_handler(lambda event, record: self.controller.enqueue(KEY))

    def reconcile(self, key: object = KEY) -> float | None:
        """Certificates when due, then :meth:`sync`; when to look again without a change (for the
        certificates, or a webhook that does not answer yet)."""
        if self.certificates is not None and time.monotonic() >= self._certificates_due:
            self.certificates()
            self._certificates_due = time.monotonic() + CERTIFICATES_EVERY
        self.sync()
        waits = [*([CERTIFICATES_EVERY] if self.certificates else []), *([PROBE_EVERY] if self.waiting else [])]
        return min(waits, default=None)

    def sync(self) -> None:
        """Register what is due, repair what drifted, from the caches."""
        secret = _only(self.secret)
        ca_bundle = base64.b64decode(((secret or {}).get("data") or {}).get("ca.crt") or "")
        was_waiting, self.waiting = self.waiting, False
        if not ca_bundle:
            log.info("registration: waiting for ca.crt in the serving Secret")
            return
        owner = None
        if self.owner is not None:
            owner = _only(self.owner)
            if owner is None or owner["metadata"].get("deletionTimestamp"):
                # The install is being deleted: what is registered goes with its owner.
                log.info("registration: the owner ClusterRole is gone or going; registering nothing")
                return
        live = {key: _only(cache) for key, cache in self.live.items()}
        missing = [t for t in self.templates if live[t["kind"], t["metadata"]["name"]] is None]
        serving = not missing or self._serving(missing, ca_bundle)
        for template in self.templates:
            key = (template["kind"], template["metadata"]["name"])
            want = desired(template, ca_bundle, owner)
            if live[key] is None and not serving:
                continue
            if live[key] is not None and covered(live[key], want):
                self.registered.add(key)
                continue
            self.rest.apply(WEBHOOK_CONFIGURATIONS[key[0]], want, REGISTRATION_FIELD_MANAGER)
            log.info("registration: %s %s %s", "applied" if live[key] is not None else "registered", *key)
            if self.metrics is not None:
                self.metrics.writes.labels(key[0], "apply").inc()
            self.registered.add(key)
        if missing and not serving:
            self.waiting = True
            if not was_waiting:  # asked again every PROBE_EVERY: said once
                log.info("registration: waiting for the webhook to serve before registering %s",
                         ", ".join(f"{t['kind']} {t['metadata']['name']}" for t in missing))

    def _serving(self, templates: list[dict[str, Any]], ca_bundle: bytes) -> bool:
        services, urls = targets(templates)
        return (all(has_ready_endpoint(r.object for r in self.slices[key].items()) and routed(_only(self.services[key]), port)
                    for key, port in services)
                and all(url_serves(url, ca_bundle) for url in urls))


def _only(cache: Informer[ObjectRecord]) -> dict[str, Any] | None:
    """The one object a cache of one name holds, if any."""
    found = cache.items()
    return found[0].object if found else None
