"""The webhook's registration with the API server: made once the webhook serves, never before, and
kept from then on.

A fail-closed webhook registered in the same instant as its Deployment refuses every Volcano Pod
until a replica serves (image pulled, certificates made), and Volcano's controller ends a job whose
Pods keep being refused. So the configurations (``webhook_configurations``) are applied by the
reconciler's leader, as Volcano's webhook manager and Kyverno register theirs, once what they name
answers: the Service has a ready endpoint (``clientConfig.service``) or the URL's ``/readyz`` answers
(``clientConfig.url``). From then on they are kept — ``caBundle`` follows the serving Secret's
``ca.crt``, drift is repaired — and stay when the endpoints go: a crash still refuses an unwired Pod,
and Volcano retries. Each carries an owner reference to a ClusterRole of the install
(``registration_owner``), so deleting the install makes the garbage collector delete them, whatever
the order; with that ClusterRole gone or going, nothing is (re)registered.
"""

from __future__ import annotations

import base64
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes.client.rest import ApiException

from volcano_job_webhook.certs.cluster import WEBHOOK_CONFIGURATIONS, CertsError
from volcano_job_webhook.config import ConfigError
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.kinds import CLUSTER_ROLE, ENDPOINT_SLICE

from .compare import covered
from .kinds import OWNED

log = logging.getLogger(__name__)

FIELD_MANAGER = "volcano-job-webhook-registration"


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
        metadata["ownerReferences"] = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    webhooks = [{**hook, "clientConfig": {**hook["clientConfig"], "caBundle": bundle}} for hook in template.get("webhooks") or []]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": template["kind"], "metadata": metadata, "webhooks": webhooks}


def targets(templates: Iterable[dict[str, Any]]) -> tuple[set[tuple[str, str]], set[str]]:
    """The Services (namespace, name) and URLs the webhooks of ``templates`` are called at."""
    services: set[tuple[str, str]] = set()
    urls: set[str] = set()
    for template in templates:
        for hook in template.get("webhooks") or []:
            client_config = hook["clientConfig"]
            if "service" in client_config:
                services.add((client_config["service"]["namespace"], client_config["service"]["name"]))
            else:
                urls.add(client_config["url"])
    return services, urls


def has_ready_endpoint(slices: Iterable[dict[str, Any]]) -> bool:
    """Whether any endpoint of ``slices`` takes traffic (an unset ``ready`` counts as ready, as the API documents)."""
    return any((endpoint.get("conditions") or {}).get("ready") is not False and endpoint.get("addresses")
               for piece in slices for endpoint in piece.get("endpoints") or [])


def url_serves(url: str, ca_bundle: bytes, timeout: float = 2.0) -> bool:
    """Whether the server behind ``url`` answers ``/readyz`` with 200 over TLS checked against ``ca_bundle``."""
    parts = urlsplit(url)
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    try:
        with urllib.request.urlopen(f"{parts.scheme}://{parts.netloc}/readyz", context=context, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class Registrar:
    """Keeps the configurations of ``templates`` registered, writing only while ``is_leader()``."""

    rest: Rest
    templates: list[dict[str, Any]]
    secret_namespace: str
    secret_name: str
    owner: str | None
    is_leader: Callable[[], bool]
    interval: float = 2.0
    on_write: Callable[[str, str], None] = lambda kind, name: None
    # The self-managed certificates' one step (certs.cluster.sync), run first in a pass when due: the
    # serving Secret it writes is what the registration then trusts.
    certificates: Callable[[], object] | None = None
    certificates_interval: float = 60.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="registration", daemon=True)
        self.registered: set[tuple[str, str]] = set()
        self._certificates_due = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        # A poll, not watches: four small GETs every two seconds, and the answer to "does it serve?"
        # must be asked again anyway for a URL.
        while not self._stop.is_set():
            if self.is_leader():
                try:
                    self.sync()
                except ApiException as exc:
                    log.warning("registration: the API server answered %s %s", exc.status, exc.reason)
                except (OSError, CertsError) as exc:
                    log.warning("registration: %s", exc)
            self._stop.wait(self.interval)

    def sync(self) -> list[str]:
        """One pass: certificates made or renewed when due, then register what is due, repair what
        drifted; the names of the configurations written."""
        if self.certificates is not None and time.monotonic() >= self._certificates_due:
            self.certificates()
            self._certificates_due = time.monotonic() + self.certificates_interval
        secret = self.rest.get(OWNED["Secret"], self.secret_namespace, self.secret_name)
        ca_bundle = base64.b64decode(((secret or {}).get("data") or {}).get("ca.crt") or "")
        if not ca_bundle:
            log.info("registration: waiting for ca.crt in Secret %s/%s", self.secret_namespace, self.secret_name)
            return []
        owner = None
        if self.owner is not None:
            owner = self.rest.get(CLUSTER_ROLE, "", self.owner)
            if owner is None or owner["metadata"].get("deletionTimestamp"):
                # The install is being deleted: what is registered goes with its owner.
                log.info("registration: ClusterRole %s is gone or going; registering nothing", self.owner)
                return []
        live = {(t["kind"], t["metadata"]["name"]): self.rest.get(WEBHOOK_CONFIGURATIONS[t["kind"]], "", t["metadata"]["name"])
                for t in self.templates}
        missing = [t for t in self.templates if live[t["kind"], t["metadata"]["name"]] is None]
        serving = not missing or self._serving(missing, ca_bundle)
        written = []
        for template in self.templates:
            key = (template["kind"], template["metadata"]["name"])
            want = desired(template, ca_bundle, owner)
            if live[key] is None and not serving:
                continue
            if live[key] is not None and covered(live[key], want):
                self.registered.add(key)
                continue
            self.rest.apply(WEBHOOK_CONFIGURATIONS[key[0]], want, FIELD_MANAGER)
            log.info("registration: %s %s %s", "applied" if live[key] is not None else "registered", *key)
            self.on_write(*key)
            self.registered.add(key)
            written.append(key[1])
        if missing and not serving:
            log.info("registration: waiting for the webhook to serve before registering %s",
                     ", ".join(f"{t['kind']} {t['metadata']['name']}" for t in missing))
        return written

    def _serving(self, templates: list[dict[str, Any]], ca_bundle: bytes) -> bool:
        services, urls = targets(templates)
        for namespace, name in services:
            slices = self.rest.call("GET", ENDPOINT_SLICE.path(namespace),
                                    query=[("labelSelector", f"kubernetes.io/service-name={name}")]).get("items") or []
            if not has_ready_endpoint(slices):
                return False
        return all(url_serves(url, ca_bundle) for url in urls)
