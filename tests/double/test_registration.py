"""The reconciler's registration of the webhook (webhook/reconciler/registration.py), woken by watches:
nothing until the webhook serves (a ready endpoint the Service's cluster IP routes to), then registered with the serving Secret's CA and owned by the
install's ClusterRole, kept (drift repaired) and never withdrawn when the endpoints go; nothing
registered by a standby or once the ClusterRole is gone. Why the API double: the install's objects staged in its store without
a request, and its request log showing nothing written (fault injection). The install window,
fail-closed after registration and the garbage collector's uninstall run on a real API server in
tests/apiserver/test_envtest_install.py, the registration's calls against the install's RBAC in
tests/apiserver/test_rbac.py."""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.apiserver import FakeApiServer, ResourceType
from tests.helpers.envtest import wait_until
from volcano_job_webhook.certs.cluster import WEBHOOK_CONFIGURATIONS, sync
from volcano_job_webhook.config import ConfigError
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.reconciler.manager import Manager
from volcano_job_webhook.reconciler.registration import Registrar, desired, has_ready_endpoint, load_configurations

NS, SERVICE, SECRET, OWNER = "volcano-job-webhook", "volcano-job-webhook", "volcano-job-webhook-tls", "volcano-job-webhook"
HOOK = {"name": "pods.volcano-job-webhook.io", "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
        "clientConfig": {"service": {"namespace": NS, "name": SERVICE, "path": "/mutate", "port": 443}},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}
TEMPLATES = [
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
     "metadata": {"name": "volcano-job-webhook", "labels": {"app.kubernetes.io/name": "volcano-job-webhook"}}, "webhooks": [HOOK]},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
     "metadata": {"name": "volcano-job-webhook"}, "webhooks": [{**HOOK, "name": "jobs.volcano-job-webhook.io"}]},
]
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_load_configurations_takes_a_list_or_documents(tmp_path: Path) -> None:
    listed, documents = tmp_path / "list.yaml", tmp_path / "docs.yaml"
    listed.write_text(yaml.safe_dump(TEMPLATES))
    documents.write_text(yaml.safe_dump_all(TEMPLATES))
    assert load_configurations(listed) == load_configurations(documents) == TEMPLATES


@pytest.mark.parametrize(("content", "says"), [
    ("[]", "no configuration in it"),
    ("- {kind: Secret, metadata: {name: x}}", "every item must be a named MutatingWebhookConfiguration"),
    ("- {kind: MutatingWebhookConfiguration, metadata: {}}", "every item must be a named"),
    ("- {kind: MutatingWebhookConfiguration, metadata: {name: x}, webhooks: [{name: a, clientConfig: {}}]}",
     "webhook 'a' needs exactly one of clientConfig.service and clientConfig.url"),
    ("- [unclosed", "webhooks.yaml"),
])
def test_load_configurations_refuses_what_it_cannot_register(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "webhooks.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=says):
        load_configurations(path)


def test_desired_trusts_the_bundle_in_every_webhook_and_names_the_owner() -> None:
    owner = {"metadata": {"name": OWNER, "uid": "u-1"}}
    want = desired({**TEMPLATES[0], "webhooks": [HOOK, {**HOOK, "name": "b"}]}, CA, owner)
    assert [h["clientConfig"]["caBundle"] for h in want["webhooks"]] == [base64.b64encode(CA).decode()] * 2
    assert want["webhooks"][0]["clientConfig"]["service"] == HOOK["clientConfig"]["service"]
    assert want["metadata"]["ownerReferences"] == [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": OWNER, "uid": "u-1"}]
    assert "ownerReferences" not in desired(TEMPLATES[0], CA, None)["metadata"]
    assert "caBundle" not in HOOK["clientConfig"]  # the template itself is left as it was


@pytest.mark.parametrize(("endpoints", "ready"), [
    ([], False),
    ([{"addresses": ["10.0.0.1"], "conditions": {"ready": False}}], False),
    ([{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}], True),
    ([{"addresses": ["10.0.0.1"], "conditions": {}}], True),  # unset: ready, as the API documents
    ([{"addresses": [], "conditions": {"ready": True}}], False),
])
def test_a_ready_endpoint_is_one_that_takes_traffic(endpoints: list[dict[str, Any]], ready: bool) -> None:
    assert has_ready_endpoint([{"endpoints": endpoints}]) is ready


# Against the API double --------------------------------------------------------------------------


@pytest.fixture
def cluster(api_double: FakeApiServer) -> FakeApiServer:
    api_double.register_resource(ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"))
    api_double.register_resource(ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False))
    api_double.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    api_double.put_object({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": OWNER}, "rules": []})
    return api_double


@pytest.fixture
def webhook() -> Iterator[socket.socket]:
    """Where the Service's cluster IP (127.0.0.1 here) leads: a bound socket, refusing connections until
    it listens (kube-proxy's rule for a new endpoint still missing, a REJECT until then)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound


@contextlib.contextmanager
def registering(server: FakeApiServer, webhook: socket.socket, leading: bool = True,
                **options: Any) -> Iterator[tuple[Manager, Registrar]]:
    """A registrar on a manager of its own, its caches synced; leading (its controller running) unless
    told. Its webhooks are called at the Service's port, ``webhook``'s."""
    port = webhook.getsockname()[1]
    templates = [{**t, "webhooks": [{**h, "clientConfig": {"service": {**h["clientConfig"]["service"], "port": port}}}
                                    for h in t["webhooks"]]} for t in TEMPLATES]
    server.put_object({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NS},
                       "spec": {"clusterIP": "127.0.0.1", "ports": [{"port": port}]}})
    manager = Manager(server.api_client())
    registrar = Registrar(manager, Rest(server.api_client()), templates, NS, SECRET, OWNER, **options)
    manager.start()
    try:
        wait_until(lambda: manager.ready, 10, "the registration's caches synced")
        if leading:
            manager.lead()
        yield manager, registrar
    finally:
        manager.stop()


def registered(server: FakeApiServer) -> dict[str, Any]:
    return {kind: server.get_object(f"{resource.plural}.admissionregistration.k8s.io", "volcano-job-webhook")
            for kind, resource in WEBHOOK_CONFIGURATIONS.items()}


def bundles(server: FakeApiServer) -> set[str]:
    return {h["clientConfig"]["caBundle"] for obj in registered(server).values() if obj for h in obj["webhooks"]}


def serve(server: FakeApiServer, ready: bool = True) -> None:
    server.put_object({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": f"{SERVICE}-abc", "namespace": NS, "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": ready}}]})


def secret(server: FakeApiServer, ca: bytes = CA) -> None:
    server.put_object({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NS}, "type": "kubernetes.io/tls",
                                        "data": {"ca.crt": base64.b64encode(ca).decode(), "tls.crt": "", "tls.key": ""}})


def writes(server: FakeApiServer) -> list[tuple[str, str]]:
    return [(r.verb, r.resource) for r in server.requests if r.verb not in ("get", "list", "watch")]


def test_nothing_is_registered_until_the_webhook_serves(cluster: FakeApiServer, webhook: socket.socket) -> None:
    webhook.listen()
    with registering(cluster, webhook) as (_, registrar):
        time.sleep(0.3)
        assert registered(cluster) == dict.fromkeys(WEBHOOK_CONFIGURATIONS)  # no Secret yet
        secret(cluster)
        serve(cluster, ready=False)
        time.sleep(0.3)
        assert registered(cluster) == dict.fromkeys(WEBHOOK_CONFIGURATIONS)  # no ready endpoint
        serve(cluster)
        wait_until(lambda: None not in registered(cluster).values(), 10, "both registered once an endpoint is ready")
        for kind, obj in registered(cluster).items():
            assert {h["clientConfig"]["caBundle"] for h in obj["webhooks"]} == {base64.b64encode(CA).decode()}, kind
            assert obj["metadata"]["ownerReferences"][0]["uid"] == cluster.get_object(
                "clusterroles.rbac.authorization.k8s.io", OWNER)["metadata"]["uid"]
        wait_until(lambda: len(registrar.registered) == 2, 10, "both seen registered")
        cluster.clear_requests()
        time.sleep(0.5)
        assert writes(cluster) == [], "as it should be: nothing written"


def test_a_ready_endpoint_is_not_registered_until_the_services_cluster_ip_routes_to_it(
        cluster: FakeApiServer, webhook: socket.socket) -> None:
    """The install window on a busy node: the endpoint is ready a moment before kube-proxy has a rule
    for it, and the API server's call through the cluster IP is refused until it has (the 'connection
    refused' a Volcano Pod met at install)."""
    secret(cluster)
    serve(cluster)
    with registering(cluster, webhook):
        time.sleep(1.5)  # more than one probe apart
        assert registered(cluster) == dict.fromkeys(WEBHOOK_CONFIGURATIONS), "registered before the Service routes"
        webhook.listen()  # kube-proxy has synced: asked again without a change to watch
        wait_until(lambda: None not in registered(cluster).values(), 10, "both registered once the Service routes")


def test_once_registered_it_is_kept_and_never_withdrawn(cluster: FakeApiServer, webhook: socket.socket) -> None:
    secret(cluster)
    serve(cluster)
    webhook.listen()
    with registering(cluster, webhook):
        wait_until(lambda: None not in registered(cluster).values(), 10, "registered")
        # Every replica gone: it stays, fail-closed.
        cluster.delete_object("endpointslices.discovery.k8s.io", f"{SERVICE}-abc", NS)
        time.sleep(0.3)
        assert None not in registered(cluster).values()
        # Someone loosens it: put back.
        live = registered(cluster)["MutatingWebhookConfiguration"]
        live["webhooks"][0]["failurePolicy"] = "Ignore"
        cluster.put_object({**live, "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration"})
        wait_until(lambda: registered(cluster)["MutatingWebhookConfiguration"]["webhooks"][0]["failurePolicy"] == "Fail", 10,
                   "the loosened configuration repaired")
        # A renewed CA reaches every webhook.
        secret(cluster, CA + CA)
        wait_until(lambda: bundles(cluster) == {base64.b64encode(CA + CA).decode()}, 10, "the renewed CA in every webhook")


def test_nothing_is_registered_by_a_standby_or_while_the_install_is_deleted(cluster: FakeApiServer, webhook: socket.socket, caplog) -> None:
    caplog.set_level(logging.INFO, logger="volcano_job_webhook")
    secret(cluster)
    serve(cluster)
    webhook.listen()
    with registering(cluster, webhook, leading=False) as (manager, registrar):
        time.sleep(0.3)
        assert registered(cluster) == dict.fromkeys(WEBHOOK_CONFIGURATIONS), "a standby registers nothing"
        cluster.delete_object("clusterroles.rbac.authorization.k8s.io", OWNER)
        # Waited for, not slept on: a leader that has not yet seen the delete rightly registers.
        wait_until(lambda: not registrar.owner.items(), 10, "the owner's delete in the registrar's cache")
        manager.lead()
        wait_until(lambda: "registering nothing" in caplog.text, 10, "the leader's look at the registrations")
        assert registered(cluster) == dict.fromkeys(WEBHOOK_CONFIGURATIONS), "nothing once the owner is gone"


def test_self_managed_certificates_are_made_first_and_trusted_by_the_registration(cluster: FakeApiServer, webhook: socket.socket) -> None:
    serve(cluster)
    webhook.listen()
    api = cluster.api_client()
    certificates = functools.partial(sync, api, NS, SECRET, "volcano-job-webhook-ca", SERVICE, NS)
    with registering(cluster, webhook, certificates=certificates):
        wait_until(lambda: None not in registered(cluster).values(), 10, "registered with the certificates made")
        tls = cluster.get_object("secrets", SECRET, NS)
        assert cluster.get_object("secrets", "volcano-job-webhook-ca", NS) is not None
        assert "ca.key" not in tls["data"]  # the CA's key never in the Secret serve reads
        wait_until(lambda: bundles(cluster) == {tls["data"]["ca.crt"]}, 10, "the registration trusting the serving Secret's CA")
        cluster.clear_requests()
        time.sleep(0.5)
        assert writes(cluster) == [], "not due again for a minute: no certificate work, nothing written"
