"""The ClusterRole and Role grant exactly what the webhook and the reconciler need, on a real API
server with OwnerReferencesPermissionEnforcement on (the strictest mode).

The calls are not listed by hand: the product runs every path that talks to the API server (job
cache and live GET, reconciles of every kind, scaling, drift in every kind, plugin removal, job
deletion, unmanaged objects of every kind, an invalid job, leader election, the webhook registration and
the self-managed certificates it makes and renews) as the manifests' ServiceAccount, and the API
server's audit log says which requests it made. Two permissions are checked without a request of
their own: server-side apply that creates an object needs ``create`` as well as ``patch`` (the audit
log shows a ``patch`` answered 201; the reconciler creates with a POST, but counted all the same), and with OwnerReferencesPermissionEnforcement an object with a
``blockOwnerDeletion`` reference to a Job needs ``update`` on ``jobs/finalizers``.

The split variant's two ServiceAccounts are checked the same way, each a token user of its own on an
API server of the test's own, the audit log telling the two processes' requests apart.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from kubernetes import client

from tests.apiserver.test_reconciler import events, objects
from tests.helpers.envtest import (
    ASSETS_ENV,
    JOB_API_VERSION,
    NOBODY,
    OWNER_REFERENCES_ENFORCEMENT,
    WEBHOOK_USER,
    ApiServerFactory,
    EnvTest,
    create,
    delete,
    find_assets,
    grant_role,
    install_job_crd,
    install_jobset_crd,
    install_rbac,
    new_namespace,
    rbac_objects,
    read,
    replace,
    wait_for_owner_kind,
    wait_until,
)
from tests.helpers.jobs import example_job
from tests.helpers.kustomize import DEFAULT_VARIANT, build_variant, kubectl_or_skip
from tests.helpers.manifests_util import rbac_permissions, settings, webhook_configurations
from volcano_job_webhook.certs.cluster import sync as certs_sync
from volcano_job_webhook.certs.secret import ServingSecret
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.kinds import BATCH_JOB, JOBSET
from volcano_job_webhook.reconciler import Reconciler, registration
from volcano_job_webhook.reconciler.leader import LeaderElector
from volcano_job_webhook.reconciler.manager import Manager
from volcano_job_webhook.reconciler.registration import Registrar
from volcano_job_webhook.server.jobs.kube import KubeJobSource

LEASE = ("volcano-job-webhook-reconciler", "volcano-job-webhook")
CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def register_as_the_install(admin: client.ApiClient, api: client.ApiClient, serve_api: client.ApiClient) -> None:
    """The reconciler's registration and self-managed certificates through ``api``, with the default
    variant's settings: the certificates made (and renewed, a year on), a ready endpoint of the
    Service, both configurations registered and one repaired; and serve's read of its certificate
    (certs_from_secret: its watch, which sees the renewal) through ``serve_api``. Each configuration selects a namespace that does not
    exist, so nothing on a shared server ever calls it; they are deleted at the end (by ``admin``:
    the reconciler never deletes one)."""
    install = build_variant(DEFAULT_VARIANT)
    config = settings(install)
    ns, tls, ca = config["service_namespace"], config["tls_secret"], config["ca_secret"]
    templates = webhook_configurations(install)
    for template in templates:
        for hook in template["webhooks"]:
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": f"nowhere-{uuid.uuid4().hex[:8]}"}}
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
              "metadata": {"name": f"{config['service_name']}-rbac", "namespace": ns,
                           "labels": {"kubernetes.io/service-name": config["service_name"]}},
              "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}]}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": config["service_name"], "namespace": ns},
               "spec": {"ports": [{"port": 443, "targetPort": 8443}]}}
    create(admin, slice_)
    create(admin, service)
    certificates = functools.partial(certs_sync, api, ns, tls, ca, config["service_name"], ns)
    manager = Manager(api)
    registrar = Registrar(manager, Rest(api), templates, ns, tls, config["registration_owner"], certificates=certificates)
    # No kube-proxy here: the Service read through the reconciler's identity is all the probe needs of RBAC.
    probed = mock.patch.object(registration, "routed", lambda found, port: bool(found and found["spec"]["clusterIP"]))
    manager.start()
    manager.lead()
    serving = ServingSecret(serve_api, ns, tls)  # serve's watch of its certificate

    def mutating() -> dict[str, Any]:
        found = read(admin, "admissionregistration.k8s.io/v1", templates[0]["kind"], templates[0]["metadata"]["name"])
        assert found is not None
        return found

    probed.start()  # from here on, as the finally stops it
    try:
        wait_until(lambda: registrar.registered == {(t["kind"], t["metadata"]["name"]) for t in templates}, 20, "both registered")
        first = wait_until(lambda: serving.pair, 10, "serve's certificate, watched through the API")
        certificates(now=datetime.now(UTC) + timedelta(days=300))  # due for renewal: the Secret updated in place
        wait_until(lambda: serving.pair != first, 10, "the renewal, seen by serve's watch")
        loosened = mutating()
        loosened["webhooks"][0]["timeoutSeconds"] = 29
        replace(admin, loosened)
        wait_until(lambda: mutating()["webhooks"][0]["timeoutSeconds"] != 29, 10, "the drift repaired")
    finally:
        serving.informer.stop()
        manager.stop()
        for template in templates:
            delete(admin, "admissionregistration.k8s.io/v1", template["kind"], template["metadata"]["name"])
        probed.stop()
        delete(admin, "discovery.k8s.io/v1", "EndpointSlice", slice_["metadata"]["name"], ns)
        delete(admin, "v1", "Service", service["metadata"]["name"], ns)
        for name in (tls, ca):
            delete(admin, "v1", "Secret", name, ns)


def exercise(server: EnvTest, webhook_user: str, reconciler_user: str, workdir: Path) -> datetime:
    """Every path of the product that talks to the API server: the webhook's as ``webhook_user``
    (job cache and live GET, its certificate read), the reconciler's as ``reconciler_user`` (leader
    election; reconciles creating, scaling, repairing and deleting objects of every kind, finding
    objects it does not own, an invalid job; Indexed Jobs and JobSets; the registration and the
    certificates it makes and renews). Returns when it began, for the audit log."""
    admin = server.api_client()
    namespace = new_namespace(admin)
    delete(admin, "coordination.k8s.io/v1", "Lease", *LEASE)
    # Objects of every kind that a job's objects would be, made by someone else (no label).
    create(admin, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "svc-demo-svc", "namespace": namespace}})
    for kind, api_version, name, body in (
        ("Secret", "v1", "ssh-demo-ssh", {}),
        ("ConfigMap", "v1", "ssh-demo-svc", {}),
        ("Service", "v1", "ssh-demo", {"spec": {"ports": [{"port": 80}]}}),
        ("NetworkPolicy", "networking.k8s.io/v1", "ssh-demo", {"spec": {"podSelector": {}}}),
    ):
        create(admin, {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace}, **body})
    install_jobset_crd(admin)  # Indexed Jobs and JobSets too (docs/workloads.md)
    # A server that ran before the CRD came refuses its objects' owner references for up to 30 s:
    # waited out here, where the audit log does not count.
    wait_for_owner_kind(server.api_client(reconciler_user), namespace, JOBSET.api_version, JOBSET.kind)
    since = datetime.now(UTC)

    elector = LeaderElector(server.api_client(reconciler_user), *LEASE, "me", lease_duration=3, renew_deadline=2, retry_period=0.3)
    elector.start()
    wait_until(lambda: elector.is_leader, 10, "leadership")
    reconciler = Reconciler(server.api_client(reconciler_user), WebhookSettings(), Chain())  # all namespaces, every workload kind
    reconciler.start()
    source = KubeJobSource(server.api_client(webhook_user))
    source.start()
    try:
        for name in ("mpi", "ray", "svc", "ssh"):
            create(admin, example_job(name, namespace))
        invalid = example_job("env", namespace)
        invalid["spec"]["plugins"]["nope"] = []
        create(admin, invalid)
        wait_until(lambda: len(objects(admin, namespace)) == 10, 20, "every job's objects")
        for workload in (indexed_workload(namespace), jobset_workload(namespace)):
            create(admin, workload)
        wait_until(lambda: {("ConfigMap", "idx-svc"), ("ConfigMap", "js-svc")} <= set(objects(admin, namespace)), 20,
                   "the Indexed Job's and the JobSet's objects")
        job = read(admin, JOB_API_VERSION, "Job", "mpi-demo", namespace)
        assert job is not None
        job["spec"]["tasks"][1]["replicas"] = 3
        replace(admin, job)
        wait_until(lambda: objects(admin, namespace)[("ConfigMap", "mpi-demo-svc")]["data"]["VC_MPIWORKER_NUM"] == "3", 10, "scaled")
        delete(admin, "v1", "Service", "svc-demo", namespace)
        wait_until(lambda: ("Service", "svc-demo") in objects(admin, namespace), 10, "a deleted Service made again")
        # Drift in an object of every kind, repaired by apply.
        for kind, api_version, name, part, value in (
            ("ConfigMap", "v1", "ray-demo-svc", "data", {"VC_HEAD_NUM": "7"}),
            ("Secret", "v1", "mpi-demo-ssh", "data", {"config": "eA=="}),
            ("Service", "v1", "ray-demo", "spec", {"publishNotReadyAddresses": True}),
            ("NetworkPolicy", "networking.k8s.io/v1", "ray-demo", "spec", {"policyTypes": ["Ingress", "Egress"]}),
        ):
            obj = read(admin, api_version, kind, name, namespace)
            assert obj is not None
            good = obj[part]
            obj[part] = {**good, **value}
            replace(admin, obj)
            wait_until(lambda v=api_version, k=kind, n=name, p=part, g=good: (o := read(admin, v, k, n, namespace)) and o[p] == g,
                       10, f"{kind} repaired")
        delete(admin, JOB_API_VERSION, "Job", "mpi-demo", namespace)
        wait_until(lambda: not any(name.startswith("mpi-demo") for _, name in objects(admin, namespace)), 10, "mpi's objects deleted")
        assert events(admin, namespace, "InvalidPlugins") and events(admin, namespace, "ResourceNotManaged")
        # The webhook's live GET on a cache miss.
        source.informer.stop()
        create(admin, example_job("tensorflow", namespace))
        assert asyncio.run(source.get(namespace, "tf-demo")) is not None
        # An opted-in workload's Pods: the webhook GETs the workload.
        assert asyncio.run(source.get(namespace, "idx", None, BATCH_JOB)) is not None
        assert asyncio.run(source.get(namespace, "js", None, JOBSET)) is not None
        register_as_the_install(admin, server.api_client(reconciler_user), server.api_client(webhook_user))
    finally:
        source.stop()
        reconciler.stop()
        elector.stop()
    time.sleep(0.5)  # the audit log is written as requests complete
    return since


def used_permissions(server: EnvTest, user: str, since: datetime) -> set[tuple[str, str, str]]:
    """What ``user``'s requests since ``since`` needed, none of them refused: each request's
    permission, plus the two without a request of their own (see the module docstring)."""
    requests = server.audit_events(user, since)
    refused = [(e.verb, e.resource, e.name) for e in requests if e.code == 403]
    assert refused == [], f"{user}: refused"
    used = {e.permission for e in requests}
    used |= {(e.api_group, e.resource, "create") for e in requests if e.verb == "patch" and e.code == 201}
    if any(e.verb in ("create", "patch") and e.code == 201 and e.resource != "events" for e in requests):
        # Every side object has a blockOwnerDeletion reference to its Job.
        used.add(("batch.volcano.sh", "jobs/finalizers", "update"))
        # And the Indexed Job's and JobSet's objects to theirs.
        used |= {("batch", "jobs/finalizers", "update"), ("jobset.x-k8s.io", "jobsets/finalizers", "update")}
    return used


def test_granted_permissions_are_exactly_the_calls_made(apiserver_factory: ApiServerFactory, tmp_path: Path) -> None:
    server = apiserver_factory((OWNER_REFERENCES_ENFORCEMENT,))
    since = exercise(server, WEBHOOK_USER, WEBHOOK_USER, tmp_path)
    used, granted = used_permissions(server, WEBHOOK_USER, since), rbac_permissions()
    assert used - granted == set(), "calls the ClusterRole/Role does not grant"
    assert granted - used == set(), "permissions granted that the code never uses"


def test_split_identities_cover_exactly_what_each_process_calls(tmp_path: Path) -> None:
    """manifests/overlays/split gives the webhook and the reconciler a ServiceAccount each: each is a
    token user here, on an API server of this test's own (its users are fixed when it starts) with the
    split variant's RBAC and OwnerReferencesPermissionEnforcement. What each asked for must be what
    its ServiceAccount is granted, no more and no less, and nothing of it refused."""
    assets = find_assets()
    if assets is None:
        pytest.skip(f"{ASSETS_ENV} is not set to a directory with kube-apiserver and etcd")
    kubectl_or_skip()  # the split variant's RBAC is rendered by kubectl's kustomize
    webhook_sa, reconciler_sa = "volcano-job-webhook", "volcano-job-webhook-reconciler"
    with EnvTest(assets, tmp_path / "apiserver", (OWNER_REFERENCES_ENFORCEMENT,), users=(webhook_sa, reconciler_sa)) as server:
        admin = server.api_client()
        install_job_crd(admin)
        install_rbac(admin, "split")
        since = exercise(server, webhook_sa, reconciler_sa, tmp_path)
        for user in (webhook_sa, reconciler_sa):
            assert used_permissions(server, user, since) == rbac_permissions(user, "split"), user
    # The webhook's Secret reads are the watch of its own certificate, by name (tests/programs/test_manifests.py): no GET.
    assert {(g, r, v) for g, r, v in rbac_permissions(webhook_sa, "split") if r == "secrets"} == {("", "secrets", "list"), ("", "secrets", "watch")}


def indexed_workload(namespace: str) -> dict:
    """An opted-in Indexed Job with svc (no Job controller runs here: it makes no Pods)."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "idx", "namespace": namespace, "annotations": {"volcano-job-webhook/plugins": '{"svc": []}'}},
            "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "template": {
                "metadata": {"labels": {"volcano-job-webhook/enabled": "true"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}


def jobset_workload(namespace: str) -> dict:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": namespace, "annotations": {"volcano-job-webhook/plugins": '{"svc": []}'}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                "completions": 2, "parallelism": 2, "template": {
                    "metadata": {"labels": {"volcano-job-webhook/enabled": "true"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}]}}


def test_without_update_on_job_finalizers_an_enforcing_server_refuses_the_side_objects(apiserver_factory: ApiServerFactory) -> None:
    """Why the ClusterRole grants ``update`` on ``jobs/finalizers`` (docs/install.md): the manifests'
    ClusterRole minus that rule, bound in one namespace to a user with no other rights."""
    server = apiserver_factory((OWNER_REFERENCES_ENFORCEMENT,))
    admin = server.api_client()
    namespace = new_namespace(admin)
    role = next(o for o in rbac_objects() if o["kind"] == "ClusterRole")
    rules = [r for r in role["rules"] if (r["apiGroups"], r["resources"]) != (["batch.volcano.sh"], ["jobs/finalizers"])]
    assert len(rules) == len(role["rules"]) - 1
    grant_role(admin, NOBODY, namespace, "trimmed", rules)
    reconciler = Reconciler(server.api_client(NOBODY), WebhookSettings(namespaces=[namespace], resync_seconds=3600, workloads=[]), Chain())
    reconciler.start()
    try:
        create(admin, example_job("svc", namespace))
        wait_until(lambda: reconciler.metrics.api_errors.labels("403")._value.get() > 0, 15, "a refusal")
        assert objects(admin, namespace) == {}
        refused = [e for e in server.audit_events(NOBODY) if e.namespace == namespace and e.code == 403]
        assert refused and {e.verb for e in refused} == {"create"}
    finally:
        reconciler.stop()
        delete(admin, "rbac.authorization.k8s.io/v1", "RoleBinding", "trimmed", namespace)
