"""The reconciler against the API-server test double, through the real ``kubernetes`` client."""

from __future__ import annotations

import base64
import copy
import threading
import time
from collections.abc import Callable, Iterator

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from volcano_job_webhook.plugins import Chain
from tests.apiserver import FakeApiServer
from tests.conftest import EXAMPLES
from volcano_job_webhook.reconciler.leader import LeaderElector
from volcano_job_webhook.reconciler import Reconciler

MANAGED = ("configmaps", "services", "secrets", "networkpolicies.networking.k8s.io")


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def load_job(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / "jobs" / f"{name}-job.yaml").read_text())


def create_job(server: FakeApiServer, job: dict) -> dict:
    job = copy.deepcopy(job)
    job["metadata"].pop("uid", None)
    api = client.CustomObjectsApi(server.api_client())
    return api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", job["metadata"]["namespace"], "jobs", job)


def state(server: FakeApiServer) -> dict[tuple[str, str], dict]:
    """Every managed object by (kind, name), with its data/spec, for comparing end states."""
    out = {}
    for resource in MANAGED:
        for obj in server.objects(resource):
            kind = {"configmaps": "ConfigMap", "services": "Service", "secrets": "Secret"}.get(resource, "NetworkPolicy")
            out[(kind, obj["metadata"]["name"])] = obj
    return out


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        yield s


@pytest.fixture
def reconciler(server: FakeApiServer) -> Iterator[Reconciler]:
    r = Reconciler(server.api_client(), Chain(), resync_seconds=0.5)
    r.start()
    wait_for(lambda: r.ready, what="informer sync")
    yield r
    r.stop()


def test_new_job_gets_all_its_resources(server, reconciler):
    job = create_job(server, load_job("mpi"))
    wait_for(lambda: len(state(server)) == 4, what="4 objects")
    objects = state(server)
    assert set(objects) == {("Secret", "mpi-demo-ssh"), ("ConfigMap", "mpi-demo-svc"), ("Service", "mpi-demo"), ("NetworkPolicy", "mpi-demo")}
    for obj in objects.values():
        meta = obj["metadata"]
        assert meta["labels"] == {"app.kubernetes.io/managed-by": "volcano-job-webhook"}
        assert meta["ownerReferences"] == [{
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "mpi-demo",
            "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
        }]
        clean = {k: v for k, v in obj.items() if k != "status"}
        clean.setdefault("apiVersion", "networking.k8s.io/v1" if obj.get("kind") == "NetworkPolicy" else "v1")
        kubernetes_validate.validate(clean, "1.30", strict=True)
    cm = objects[("ConfigMap", "mpi-demo-svc")]
    assert cm["data"]["VC_MPIWORKER_HOSTS"] == "mpi-demo-mpiworker-0.mpi-demo,mpi-demo-mpiworker-1.mpi-demo"
    svc = objects[("Service", "mpi-demo")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"volcano.sh/job-name": "mpi-demo", "volcano.sh/job-namespace": "default"}


def test_scaling_updates_host_files_and_ssh_config_but_keeps_keys(server, reconciler):
    create_job(server, load_job("mpi"))
    wait_for(lambda: len(state(server)) == 4)
    keys_before = state(server)[("Secret", "mpi-demo-ssh")]["data"]["id_rsa"]
    api = client.CustomObjectsApi(server.api_client())
    job = api.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "mpi-demo")
    job["spec"]["tasks"][1]["replicas"] = 3
    api.replace_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "mpi-demo", job)
    wait_for(lambda: state(server)[("ConfigMap", "mpi-demo-svc")]["data"]["VC_MPIWORKER_NUM"] == "3", what="scaled host files")
    data = state(server)[("ConfigMap", "mpi-demo-svc")]["data"]
    assert data["mpiworker.host"].splitlines()[-1] == "mpi-demo-mpiworker-2.mpi-demo"
    secret = state(server)[("Secret", "mpi-demo-ssh")]["data"]
    wait_for(lambda: b"mpi-demo-mpiworker-2" in base64.b64decode(state(server)[("Secret", "mpi-demo-ssh")]["data"]["config"]))
    assert state(server)[("Secret", "mpi-demo-ssh")]["data"]["id_rsa"] == keys_before == secret["id_rsa"]


def test_host_file_follows_scaling(server, reconciler):
    create_job(server, load_job("hostfile"))
    wait_for(lambda: ("ConfigMap", "hostfile-demo-hostfile") in state(server), what="the host file")
    hostfile = lambda: state(server)[("ConfigMap", "hostfile-demo-hostfile")]["data"]["hostfile"]  # noqa: E731
    assert hostfile() == "hostfile-demo-worker-0.hostfile-demo slots=2\nhostfile-demo-worker-1.hostfile-demo slots=2\n"
    api = client.CustomObjectsApi(server.api_client())
    job = api.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "hostfile-demo")
    job["spec"]["tasks"][1]["replicas"] = 3
    api.replace_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "hostfile-demo", job)
    wait_for(lambda: hostfile().count("\n") == 3, what="the scaled host file")
    assert hostfile().splitlines()[-1] == "hostfile-demo-worker-2.hostfile-demo slots=2"
    kubernetes_validate.validate(state(server)[("ConfigMap", "hostfile-demo-hostfile")], "1.30", strict=False)


def test_removing_a_plugin_removes_its_resources(server, reconciler):
    job = load_job("ray")
    job["metadata"]["annotations"] = {"volcano-job-webhook/plugins": '{"ssh": []}'}
    create_job(server, job)
    wait_for(lambda: ("Secret", "ray-demo-ssh") in state(server) and ("Service", "ray-demo-head-svc") in state(server))
    api = client.CustomObjectsApi(server.api_client())
    api.patch_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", "default", "jobs", "ray-demo", {"metadata": {"annotations": {"volcano-job-webhook/plugins": "{}"}}},
    )
    wait_for(lambda: ("Secret", "ray-demo-ssh") not in state(server), what="ssh Secret removed")
    assert set(state(server)) == {("ConfigMap", "ray-demo-svc"), ("Service", "ray-demo"), ("NetworkPolicy", "ray-demo"), ("Service", "ray-demo-head-svc")}


def test_deleting_the_job_removes_everything_without_gc(server, reconciler):
    assert server.gc is False
    create_job(server, load_job("ray"))
    wait_for(lambda: len(state(server)) == 4)
    client.CustomObjectsApi(server.api_client()).delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "ray-demo")
    wait_for(lambda: not state(server), what="everything deleted")


def test_objects_without_our_label_are_left_alone(server, reconciler):
    core = client.CoreV1Api(server.api_client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "svc-demo-svc"}, "data": {"volcano": "made me"}})
    create_job(server, load_job("svc"))
    wait_for(lambda: ("Service", "svc-demo") in state(server) and ("NetworkPolicy", "svc-demo") in state(server))
    time.sleep(0.6)  # a resync goes by
    cm = state(server)[("ConfigMap", "svc-demo-svc")]
    assert cm["data"] == {"volcano": "made me"} and "labels" not in cm["metadata"]
    client.CustomObjectsApi(server.api_client()).delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "svc-demo")
    wait_for(lambda: set(state(server)) == {("ConfigMap", "svc-demo-svc")}, what="ours gone, theirs kept")


def test_ssh_secret_keeps_its_keys_across_restarts(server):
    create_job(server, load_job("ssh"))
    first = Reconciler(server.api_client(), Chain())
    first.start()
    wait_for(lambda: ("Secret", "ssh-demo-ssh") in state(server))
    first.stop()
    keys = state(server)[("Secret", "ssh-demo-ssh")]["data"]
    second = Reconciler(server.api_client(), Chain(), resync_seconds=0.2)
    second.start()
    wait_for(lambda: second.ready)
    time.sleep(0.5)
    second.stop()
    assert state(server)[("Secret", "ssh-demo-ssh")]["data"] == keys


def test_drift_is_repaired(server, reconciler):
    create_job(server, load_job("svc"))
    wait_for(lambda: len(state(server)) == 3)
    core = client.CoreV1Api(server.api_client())
    core.patch_namespaced_config_map("svc-demo-svc", "default", {"data": {"VC_WORKER_NUM": "99"}})
    core.patch_namespaced_service("svc-demo", "default", {"spec": {"publishNotReadyAddresses": False}})
    wait_for(lambda: state(server)[("ConfigMap", "svc-demo-svc")]["data"]["VC_WORKER_NUM"] == "2", what="ConfigMap repaired")
    wait_for(lambda: state(server)[("Service", "svc-demo")]["spec"]["publishNotReadyAddresses"] is True, what="Service repaired")


def test_faults_end_in_the_same_state_with_nothing_lost_or_duplicated(server):
    # The reference: a clean run.
    with FakeApiServer() as clean:
        r = Reconciler(clean.api_client(), Chain(), resync_seconds=0.3)
        r.start()
        for name in ("mpi", "ray", "svc"):
            create_job(clean, load_job(name))
        wait_for(lambda: len(state(clean)) == 11, what="clean state")
        r.stop()
        expected = {key: (obj.get("data", obj.get("spec")) if key[0] != "Secret" else sorted(obj["data"])) for key, obj in state(clean).items()}

    r = Reconciler(server.api_client(), Chain(), resync_seconds=0.3)
    # Faults aimed at the reconciler's own calls (the test creates jobs through the same server).
    server.fail_next(3, status=500, method="POST", path_contains="/configmaps")
    server.fail_next(2, status=429, method="POST", path_contains="/secrets", retry_after=0)
    server.fail_next(4, status=503, method="GET", path_contains="/configmaps")
    server.drop_next(1, method="POST", path_contains="/services")
    r.start()
    create_job(server, load_job("mpi"))
    wait_for(lambda: r.ready)
    server.close_watches()
    create_job(server, load_job("ray"))
    server.expire_history()
    server.close_watches()
    create_job(server, load_job("svc"))
    wait_for(lambda: len(state(server)) == 11, timeout=20, what="all objects despite faults")
    time.sleep(0.7)
    r.stop()
    got = {key: (obj.get("data", obj.get("spec")) if key[0] != "Secret" else sorted(obj["data"])) for key, obj in state(server).items()}
    for key in got:
        if key[0] == "Service" and "clusterIP" in (got[key] or {}) and key[1].endswith("head-svc"):
            got[key] = {k: v for k, v in got[key].items() if k not in ("clusterIP", "clusterIPs")}
            expected[key] = {k: v for k, v in expected[key].items() if k not in ("clusterIP", "clusterIPs")}
    assert got == expected
    creates = [r for r in server.requests if r.verb == "create" and r.status == 201 and r.resource != "jobs"]
    assert len(creates) == 11, "each object created exactly once"
    assert r.informer.relists >= 2, "the expired watch was followed by a fresh list"


def test_api_server_away_and_back(server):
    r = Reconciler(server.api_client(), Chain(), resync_seconds=0.3)
    r.start()
    create_job(server, load_job("env"))
    wait_for(lambda: r.ready)
    server.stop()
    time.sleep(0.5)
    server.restart()
    create_job(server, load_job("svc"))
    wait_for(lambda: len(state(server)) == 3, timeout=30, what="svc objects after restart")
    r.stop()


def test_two_reconcilers_with_leader_election_never_both_write(server):
    api_a, api_b = server.api_client(), server.api_client()
    leaders: list[tuple[str, bool, float]] = []
    lock = threading.Lock()

    def track(name: str) -> Callable[[bool], None]:
        def on_change(lead: bool) -> None:
            with lock:
                leaders.append((name, lead, time.monotonic()))
        return on_change

    a = LeaderElector(api_a, "rec", "default", "a", lease_duration=1.5, renew_deadline=1.0, retry_period=0.2, on_change=track("a"))
    b = LeaderElector(api_b, "rec", "default", "b", lease_duration=1.5, renew_deadline=1.0, retry_period=0.2, on_change=track("b"))
    ra = Reconciler(api_a, Chain(), resync_seconds=0.2, is_leader=lambda: a.is_leader)
    rb = Reconciler(api_b, Chain(), resync_seconds=0.2, is_leader=lambda: b.is_leader)
    a.start()
    wait_for(lambda: a.is_leader, what="a leads")
    b.start()
    ra.start()
    rb.start()
    create_job(server, load_job("svc"))
    wait_for(lambda: len(state(server)) == 3)
    time.sleep(0.5)
    assert a.is_leader and not b.is_leader
    writes = [r for r in server.requests if r.verb in ("create", "update", "patch", "delete") and r.resource != "leases"]
    assert writes and all(r.status in (200, 201) for r in writes)
    # a stops (SIGTERM): b takes over within the lease duration and does the writing from then on.
    ra.stop()
    a.stop()
    stopped = time.monotonic()
    wait_for(lambda: b.is_leader, timeout=3, what="b takes over")
    assert time.monotonic() - stopped < 1.5
    client.CustomObjectsApi(api_b).delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "svc-demo")
    wait_for(lambda: not state(server), what="b cleans up")
    rb.stop()
    b.stop()
    # Leadership intervals never overlap.
    with lock:
        events = sorted(leaders, key=lambda e: e[2])
    holding: set[str] = set()
    for name, lead, _ in events:
        if lead:
            assert not holding, f"{name} became leader while {holding} led"
            holding.add(name)
        else:
            holding.discard(name)
