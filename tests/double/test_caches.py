"""What the caches hold (webhook/kube/records.py, reconciler/owned.py): a Job as its identity and
the fields plugins read, packed; a finished Job as its identity; an owned object without its long
data values — and the reconciler still repairing drift in a value it holds only as a digest and
sending nothing on a steady resync. Why the API double: its request log (which calls a repair makes),
history expired and watches cut on cue (a relist) — fault injection; and the steady resync, which
tests/apiserver/test_reconciler.py checks on kube-apiserver, run here too for a machine without it (coverage
without the real parts)."""

from __future__ import annotations

import base64
import functools
import json
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from kubernetes import client

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.envtest import wait_until
from tests.helpers.jobs import task, volcano_job
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.kube.records import JobRecord
from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.base import Digest
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, ObjectKey
from volcano_job_webhook.reconciler import Reconciler
from volcano_job_webhook.reconciler.digests import DIGEST_OVER, digest
from volcano_job_webhook.reconciler.transforms import OwnedRecord


def training_job(name: str = "train", phase: str | None = None) -> dict[str, Any]:
    """A Job shaped like a real training job (the shape of bench/scale.py's)."""
    container = {
        "name": "main", "image": "registry.example.com/team/trainer:2026.11",
        "command": ["python", "-m", "trainer", "--config", "/etc/trainer/config.yaml"],
        "env": [{"name": f"SETTING_{i}", "value": f"value-{i}"} for i in range(12)],
        "resources": {"limits": {"cpu": "8", "memory": "32Gi"}, "requests": {"cpu": "4", "memory": "16Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/trainer"}],
        "ports": [{"name": "metrics", "containerPort": 9090}],
    }
    template = {"metadata": {"labels": {"team": "vision"}}, "spec": {
        "containers": [container], "restartPolicy": "OnFailure",
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}, {"name": "config", "configMap": {"name": "trainer"}}]}}
    job = volcano_job(
        name, uid="6a1e0c55-0000-4000-8000-000000000001", annotation={"hostfile": []},
        plugins={"env": [], "svc": [], "pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
        tasks=[task("master", 1, template=template, minAvailable=1, policies=[{"event": "TaskCompleted", "action": "CompleteJob"}]),
               task("worker", 2, template=template)],
        minAvailable=3, schedulerName="volcano", queue="default", maxRetry=3, policies=[{"event": "PodEvicted", "action": "RestartJob"}],
        status={"state": {"phase": phase or "Running", "lastTransitionTime": "2026-11-24T00:00:00Z"},
                "controlledResources": {"plugin-svc": "svc"}, "version": 1, "retryCount": 0,
                "conditions": [{"status": "Running", "lastTransitionTime": "2026-11-24T00:00:00Z"}] * 5,
                "running": 3, "minAvailable": 3})
    job["metadata"].update(resourceVersion="42", managedFields=[{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}])
    return job


def test_a_job_record_keeps_what_plugins_read_and_nothing_else():
    obj = training_job()
    record = JobRecord(obj)
    kept = record.object()
    assert kept["metadata"] == {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion", "annotations")}
    assert kept["spec"] == {"plugins": obj["spec"]["plugins"],
                            "tasks": [{k: t[k] for k in ("name", "replicas", "template")} for t in obj["spec"]["tasks"]]}
    assert kept["status"] == {"state": {"phase": "Running"}, "controlledResources": {"plugin-svc": "svc"}, "version": 1, "retryCount": 0}
    # Plugins see the same job through the record as through the object.
    chain = Chain()
    assert chain.resources(Job.from_object(kept)) == chain.resources(Job.from_object(obj))
    packed = len(record._blob or b"")  # bytes the packed fields take
    assert len(json.dumps(obj)) > 3000 and packed < 1200, packed


def test_the_packing_dictionaries_are_learned_per_kind_and_read_every_blob():
    """A dictionary for each kind, from its first objects (a Service learns nothing from ConfigMaps)."""
    from volcano_job_webhook.kube.records import Packer

    packer = Packer(learn=3)
    objects = [{"kind": kind, "image": "registry.example.com/team/trainer:2026.11", "n": i} for i in range(6) for kind in ("ConfigMap", "Service")]
    blobs = [packer.pack(obj) for obj in objects]
    assert [blob[0] for blob in blobs] == [0] * 6 + [1, 2] * 3, "the first three of each without a dictionary, then with what they taught"
    assert len(blobs[8]) < len(blobs[2]) / 2
    assert [packer.unpack(blob) for blob in blobs] == objects


def test_a_finished_job_is_kept_as_its_identity():
    record = JobRecord(training_job(phase="Completed"))
    assert record.finished and record._blob is None
    assert record.object()["metadata"]["uid"] == "6a1e0c55-0000-4000-8000-000000000001"
    assert record.object()["status"]["state"]["phase"] == "Completed" and "spec" not in record.object()


def test_an_owned_record_holds_no_key_and_no_host_file():
    key = "-----BEGIN RSA PRIVATE KEY-----\n" + "A" * 1600 + "\n-----END RSA PRIVATE KEY-----\n"
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "j-ssh", "namespace": "default", "uid": "u", "resourceVersion": "7",
                           "labels": {"app.kubernetes.io/managed-by": "volcano-job-webhook"},
                           "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "j", "uid": "ju", "controller": True}]},
              "data": {"id_rsa": base64.b64encode(key.encode()).decode(), "config": base64.b64encode(b"Port 22").decode()}}
    record = OwnedRecord(secret)
    from volcano_job_webhook.reconciler.transforms import OBJECTS

    assert b"QUFBQUFB" not in orjson.dumps(OBJECTS.unpack(record._blob)), "the key itself is not kept"
    assert record.workload == ObjectKey("default", "j") and record.workload_kind is VOLCANO_JOB and record.workload_uid == "ju"
    data = record.object()["data"]
    assert isinstance(data["id_rsa"], Digest) and data["id_rsa"] == digest(secret["data"]["id_rsa"])
    assert data["config"] == secret["data"]["config"] and not isinstance(data["config"], Digest), "short values stay"


# The reconciler on records, against the API double ---------------------------------------------


wait_for = functools.partial(wait_until, timeout=10.0, interval=0.02)


@pytest.fixture
def reconciler(api_double: FakeApiServer) -> Iterator[Reconciler]:
    r = Reconciler(api_double.api_client(), WebhookSettings(resync_seconds=3600, workloads=[]), Chain())
    r.start()
    yield r
    r.stop()


def mpi_job(name: str) -> dict[str, Any]:
    return volcano_job(name, plugins={"mpi": [], "svc": [], "ssh": []}, tasks=[("master", 1), ("worker", 4)], image="mpi")


def live(server: FakeApiServer, resource: str, name: str) -> dict[str, Any] | None:
    found = [o for o in server.objects(resource) if o["metadata"]["name"] == name]
    return found[0] if found else None


def settled(reconciler: Reconciler) -> bool:
    queue = reconciler.manager.controllers[0].queue
    return len(queue) == 0 and not queue._processing  # nothing waiting, delayed or being handled


def test_a_steady_resync_sends_nothing(api_double: FakeApiServer, reconciler: Reconciler):
    """The run without kube-apiserver; tests/apiserver/test_reconciler.py::test_a_steady_state_resync_sends_nothing
    is the real server's, over six kinds of job and three resyncs."""
    for i in range(3):
        client.CustomObjectsApi(api_double.api_client()).create_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", "default", "jobs", mpi_job(f"mpi-{i}"))
    wait_for(lambda: len(api_double.objects("secrets")) == 3 and len(api_double.objects("networkpolicies.networking.k8s.io")) == 3,
             what="every job's objects")
    wait_for(lambda: settled(reconciler), what="the queue drained")
    time.sleep(0.3)
    api_double.clear_requests()
    assert sum(c.resync() for c in reconciler.manager.controllers) == 3
    wait_for(lambda: settled(reconciler), what="the resync done")
    assert api_double.requests == [], "no call at all: nothing changed"


def test_drift_in_a_digested_value_is_repaired_and_a_secret_is_read_before_it_is_written(api_double: FakeApiServer,
                                                                                         reconciler: Reconciler):
    """What tests/apiserver/test_reconciler.py::test_drift_is_repaired_from_watch_events (deletions and short
    values, on kube-apiserver) does not reach: a long value the cache holds only as its digest, and the
    calls of a Secret's repair, from the double's request log."""
    core = client.CoreV1Api(api_double.api_client())
    client.CustomObjectsApi(api_double.api_client()).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", mpi_job("drift"))
    wait_for(lambda: live(api_double, "secrets", "drift-ssh") and live(api_double, "configmaps", "drift-svc"), what="the objects")
    keys = dict(live(api_double, "secrets", "drift-ssh")["data"])
    hosts = dict(live(api_double, "configmaps", "drift-svc")["data"])
    assert len(hosts["worker.host"]) > DIGEST_OVER, "a value the cache keeps as a digest"
    core.patch_namespaced_config_map("drift-svc", "default", {"data": {"worker.host": "intruder\n"}})
    wait_for(lambda: live(api_double, "configmaps", "drift-svc")["data"] == hosts, what="the host file repaired")
    # The Secret's ssh config edited: the Secret is written back with the keys it had, which the
    # reconciler reads from the API server (it holds only their digests).
    api_double.clear_requests()
    core.patch_namespaced_secret("drift-ssh", "default", {"data": {"config": base64.b64encode(b"Host *\n").decode()}})
    wait_for(lambda: live(api_double, "secrets", "drift-ssh")["data"] == keys, what=f"the Secret repaired: {keys} {live(api_double, 'secrets', 'drift-ssh')}")
    assert [q.verb for q in api_double.requests if q.resource == "secrets" and q.verb != "watch"][1:] == ["get", "patch"]


def test_a_relist_after_410_reports_what_was_missed(api_double: FakeApiServer, reconciler: Reconciler):
    jobs = client.CustomObjectsApi(api_double.api_client())
    for name in ("a", "b"):
        jobs.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", mpi_job(name))
    wait_for(lambda: len(api_double.objects("secrets")) == 2, what="both jobs' objects")
    api_double.expire_history()
    jobs.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "a")
    api_double.close_watches()
    wait_for(lambda: [o["metadata"]["name"] for o in api_double.objects("secrets")] == ["b-ssh"], what="a's objects gone")
    jobs = reconciler.manager.caches[VOLCANO_JOB]
    assert jobs.get("default", "a") is None and jobs.get("default", "b") is not None
    assert len([r for r in api_double.requests if r.group == VOLCANO_JOB.group and r.resource == "jobs" and r.verb == "list"]) >= 2


def test_the_first_list_reports_listed_and_a_relist_reports_changes(api_double: FakeApiServer):
    server = api_double
    from volcano_job_webhook.kube.informer import LISTED, Informer
    from volcano_job_webhook.reconciler.owned import OWNED

    core = client.CoreV1Api(server.api_client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "before"}})
    seen: list[tuple[str, str]] = []
    informer = Informer(server.api_client(), OWNED["ConfigMap"], transform=OwnedRecord)
    informer.add_event_handler(lambda kind, record: seen.append((kind, record.key[1])))
    informer.start()
    try:
        wait_for(lambda: informer.synced, what="synced")
        server.expire_history()
        core.create_namespaced_config_map("default", {"metadata": {"name": "during"}})
        server.close_watches()
        wait_for(lambda: ("ADDED", "during") in seen, what="the relist's event")
        assert seen[0] == (LISTED, "before") and (LISTED, "during") not in seen
    finally:
        informer.stop()


def test_the_index_holds_one_key_or_several_and_follows_changes():
    from types import SimpleNamespace

    from volcano_job_webhook.kube.informer import Informer
    from volcano_job_webhook.reconciler.owned import OWNED

    informer = Informer(client.ApiClient(), OWNED["ConfigMap"], transform=lambda o: o, index=lambda r: r.workload)  # type: ignore[arg-type,return-value]

    def record(name: str, workload: str, version: int) -> SimpleNamespace:
        return SimpleNamespace(key=("ns", name), version=version, workload=workload)

    def owned(workload: str) -> list[str]:
        return sorted(r.key[1] for r in informer.by_index(workload))

    for r in (record("a-svc", "a", 1), record("a-hostfile", "a", 2), record("b-svc", "b", 3)):
        informer._put(r)  # type: ignore[arg-type]
    assert owned("a") == ["a-hostfile", "a-svc"] and owned("b") == ["b-svc"]
    informer._put(record("a-svc", "b", 4))  # type: ignore[arg-type]  # its workload changed
    assert owned("a") == ["a-hostfile"] and owned("b") == ["a-svc", "b-svc"]
    informer._drop(("ns", "a-hostfile"))
    informer._drop(("ns", "b-svc"))
    assert owned("a") == [] and owned("b") == ["a-svc"] and list(informer._index) == ["b"]


def test_a_kind_not_served_yet_is_synced_as_empty_and_listed_once_served(api_double: FakeApiServer, monkeypatch):
    """Installed before Volcano's CRDs, the caches are ready (no Job can exist yet) rather than failing
    readiness, and list the kind once its CRD is there."""
    from tests.helpers.apiserver import ResourceType
    from volcano_job_webhook.kube import informer as informers
    from volcano_job_webhook.plugins.kinds import Kind

    monkeypatch.setattr(informers, "NOT_SERVED_RETRY", 0.05)
    widgets = Kind("example.com", "v1", "Widget", "widgets", "widget")
    synced: list[bool] = []
    informer = informers.Informer(api_double.api_client(), widgets, transform=OwnedRecord, on_synced=lambda: synced.append(True))
    informer.start()
    try:
        wait_for(lambda: informer.synced, what="synced on a 404")
        assert synced == [True] and informer.served is False and len(informer) == 0
        api_double.register_resource(ResourceType("example.com", "v1", "widgets", "Widget"))
        api_double.put_object({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "default"}})
        wait_for(lambda: informer.get("default", "w") is not None, what="the widget, once served")
        assert informer.served is True and synced == [True]
    finally:
        informer.stop()
