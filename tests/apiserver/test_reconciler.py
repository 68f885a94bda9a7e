"""The reconciler against a real kube-apiserver (tests/helpers/envtest.py), running as the manifests'
ServiceAccount: exactly the ClusterRoles and Roles of the install (charts/volcano-job-webhook/templates/rbac.yaml).

Each test works in a namespace of its own and its reconciler watches only that namespace; the
periodic resync is an hour unless a test says otherwise, so what happens within a test happens by
watch events. Faults a real server cannot stage are in tests/double/test_reconciler_faults.py.
"""

from __future__ import annotations

import base64
import copy
import json
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.helpers.clock import FakeClock
from tests.helpers.envtest import (
    JOB_API_VERSION,
    OWNER_REFERENCES_ENFORCEMENT,
    WEBHOOK_USER,
    ApiServerFactory,
    EnvTest,
    apply,
    create,
    delete,
    free_port,
    new_namespace,
    read,
    replace,
    request,
    resource_path,
    start_product,
    wait_until,
)
from tests.helpers.jobs import annotated, example_job, task, volcano_job
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.base import Plugin
from volcano_job_webhook.plugins.budget import DATA_LIMIT
from volcano_job_webhook.plugins.flags import Flag
from volcano_job_webhook.plugins.registry import BUILTINS, Registry
from volcano_job_webhook.reconciler import Reconciler

MODES = {"default": (), "owner-references-enforced": (OWNER_REFERENCES_ENFORCEMENT,)}
KINDS = {"ConfigMap": "v1", "Secret": "v1", "Service": "v1", "NetworkPolicy": "networking.k8s.io/v1"}
MANAGED = ("app.kubernetes.io/managed-by", "volcano-job-webhook")
WRITES = {"create", "update", "patch", "delete"}


def svc_job(namespace: str, name: str, tasks: dict[str, int]) -> dict[str, Any]:
    """Each task's container named after it."""
    return volcano_job(name, namespace=namespace, plugins={"svc": []},
                       tasks=[task(task_name, replicas, container=task_name) for task_name, replicas in tasks.items()])


def objects(api: Any, namespace: str, *, ours_only: bool = True) -> dict[tuple[str, str], dict[str, Any]]:
    """The side-object kinds in ``namespace`` by (kind, name); only ours (by label) unless told."""
    out = {}
    for kind, api_version in KINDS.items():
        for obj in request(api, "GET", resource_path(api, api_version, kind, namespace))["items"]:
            if not ours_only or (obj["metadata"].get("labels") or {}).get(MANAGED[0]) == MANAGED[1]:
                out[(kind, obj["metadata"]["name"])] = obj
    return out


def events(api: Any, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in request(api, "GET", f"/api/v1/namespaces/{namespace}/events")["items"] if e["reason"] == reason]


def product_requests(server: EnvTest, since: datetime, namespace: str) -> list[tuple[str, str, str]]:
    """What the reconciler asked of the API server in ``namespace`` since then, watches aside."""
    return [(e.verb, e.resource, e.name) for e in server.audit_events(WEBHOOK_USER, since)
            if e.namespace == namespace and e.verb != "watch"]


def sent(reconciler: Reconciler) -> float:
    """Requests the reconciler's workers sent (its caches' list and watch aside)."""
    return sum(s.value for m in reconciler.metrics.api_requests.collect() for s in m.samples if s.name.endswith("_total"))


def resync(reconciler: Reconciler) -> int:
    """A resync of every controller now, as each runs every ``resync_seconds``: how many keys it queued."""
    return sum(controller.resync() for controller in reconciler.manager.controllers)


def now() -> datetime:
    return datetime.now(UTC)


def scale(api: Any, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    job = read(api, JOB_API_VERSION, "Job", name, namespace)
    assert job is not None
    change(job)
    replace(api, job)


# What it makes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_a_new_job_gets_its_objects_in_both_owner_reference_modes(mode: str, apiserver_factory: ApiServerFactory,
                                                                   start_reconciler: Callable[..., Reconciler]) -> None:
    server = apiserver_factory(MODES[mode])
    admin = server.api_client()
    namespace = new_namespace(admin)
    start_reconciler(namespace, server)
    job = create(admin, example_job("mpi", namespace))
    wait_until(lambda: len(objects(admin, namespace)) == 4, 15, "the job's 4 objects")
    got = objects(admin, namespace)
    assert set(got) == {("Secret", "mpi-demo-ssh"), ("ConfigMap", "mpi-demo-svc"), ("Service", "mpi-demo"),
                        ("NetworkPolicy", "mpi-demo")}
    for (kind, _), obj in got.items():
        meta = obj["metadata"]
        assert meta["labels"] == dict([MANAGED])
        assert meta["ownerReferences"] == [{
            "apiVersion": JOB_API_VERSION, "kind": "Job", "name": "mpi-demo", "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True,
        }]
        assert [(m["manager"], m["operation"]) for m in meta["managedFields"]] == [("volcano-job-webhook", "Update")], "one POST"
        stored = {k: v for k, v in obj.items() if k != "status"}
        stored["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
        kubernetes_validate.validate({"apiVersion": KINDS[kind], "kind": kind, **stored}, "1.30", strict=True)
    assert got[("ConfigMap", "mpi-demo-svc")]["data"]["VC_MPIWORKER_HOSTS"] == "mpi-demo-mpiworker-0.mpi-demo,mpi-demo-mpiworker-1.mpi-demo"
    svc = got[("Service", "mpi-demo")]["spec"]
    assert svc["clusterIP"] == "None"
    assert svc["selector"] == {"volcano.sh/job-name": "mpi-demo", "volcano.sh/job-namespace": namespace}


def test_scaling_rewrites_host_files_and_ssh_config_but_keeps_the_keys(kube_admin: Any, kube_namespace: str, start_reconciler: Callable[..., Reconciler]) -> None:
    start_reconciler(kube_namespace)
    create(kube_admin, example_job("mpi", kube_namespace))
    wait_until(lambda: len(objects(kube_admin, kube_namespace)) == 4, 15, "the job's objects")
    keys = objects(kube_admin, kube_namespace)[("Secret", "mpi-demo-ssh")]["data"]["id_rsa"]
    scale(kube_admin, kube_namespace, "mpi-demo", lambda job: job["spec"]["tasks"][1].update(replicas=3))

    def scaled() -> bool:
        got = objects(kube_admin, kube_namespace)
        config = base64.b64decode(got[("Secret", "mpi-demo-ssh")]["data"]["config"])
        return got[("ConfigMap", "mpi-demo-svc")]["data"]["VC_MPIWORKER_NUM"] == "3" and b"mpi-demo-mpiworker-2" in config

    wait_until(scaled, 15, "host files and ssh config for 3 workers")
    got = objects(kube_admin, kube_namespace)
    assert got[("ConfigMap", "mpi-demo-svc")]["data"]["mpiworker.host"].splitlines()[-1] == "mpi-demo-mpiworker-2.mpi-demo"
    assert got[("Secret", "mpi-demo-ssh")]["data"]["id_rsa"] == keys


def test_the_host_file_follows_scaling(kube_admin: Any, kube_namespace: str, start_reconciler: Callable[..., Reconciler]) -> None:
    start_reconciler(kube_namespace)
    create(kube_admin, example_job("hostfile", kube_namespace))

    def hostfile() -> str | None:
        cm = objects(kube_admin, kube_namespace).get(("ConfigMap", "hostfile-demo-hostfile"))
        return cm["data"]["hostfile"] if cm else None

    assert wait_until(hostfile, 15, "the host file") == (
        "hostfile-demo-worker-0.hostfile-demo slots=2\nhostfile-demo-worker-1.hostfile-demo slots=2\n")
    scale(kube_admin, kube_namespace, "hostfile-demo", lambda job: job["spec"]["tasks"][1].update(replicas=3))
    wait_until(lambda: (hostfile() or "").count("\n") == 3, 15, "the scaled host file")
    assert (hostfile() or "").splitlines()[-1] == "hostfile-demo-worker-2.hostfile-demo slots=2"


def test_a_field_we_no_longer_set_is_removed_and_fields_of_others_stay(kube_admin: Any, kube_namespace: str,
                                                                         start_reconciler: Callable[..., Reconciler]) -> None:
    start_reconciler(kube_namespace)
    create(kube_admin, svc_job(kube_namespace, "two", {"a": 1, "b": 2}))
    wait_until(lambda: ("ConfigMap", "two-svc") in objects(kube_admin, kube_namespace), 15, "the host files")
    # Someone else's key and label on our ConfigMap, under their own field manager.
    apply(kube_admin, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "two-svc", "namespace": kube_namespace, "labels": {"team": "x"}}, "data": {"note": "theirs"}},
        field_manager="someone-else")
    scale(kube_admin, kube_namespace, "two", lambda job: job["spec"].update(tasks=job["spec"]["tasks"][:1]))
    wait_until(lambda: "b.host" not in objects(kube_admin, kube_namespace)[("ConfigMap", "two-svc")]["data"], 15,
               "task b's host files removed")
    cm = objects(kube_admin, kube_namespace)[("ConfigMap", "two-svc")]
    assert cm["data"] == {"a.host": "two-a-0.two", "VC_A_HOSTS": "two-a-0.two", "VC_A_NUM": "1", "note": "theirs"}
    assert cm["metadata"]["labels"] == {MANAGED[0]: MANAGED[1], "team": "x"}


def test_removing_a_plugin_removes_its_objects(kube_admin: Any, kube_namespace: str, start_reconciler: Callable[..., Reconciler]) -> None:
    start_reconciler(kube_namespace)
    job = example_job("ray", kube_namespace)
    job["metadata"]["annotations"] = {"volcano-job-webhook/plugins": '{"ssh": []}'}
    create(kube_admin, job)
    wait_until(lambda: {("Secret", "ray-demo-ssh"), ("Service", "ray-demo-head-svc")} <= set(objects(kube_admin, kube_namespace)),
               15, "the ssh Secret and the head Service")
    scale(kube_admin, kube_namespace, "ray-demo", lambda job: job["metadata"]["annotations"].update({"volcano-job-webhook/plugins": "{}"}))
    wait_until(lambda: ("Secret", "ray-demo-ssh") not in objects(kube_admin, kube_namespace), 15, "the ssh Secret removed")
    assert set(objects(kube_admin, kube_namespace)) == {("ConfigMap", "ray-demo-svc"), ("Service", "ray-demo"),
                                                   ("NetworkPolicy", "ray-demo"), ("Service", "ray-demo-head-svc")}


@pytest.mark.parametrize("mode", list(MODES))
def test_deleting_the_job_removes_everything_without_garbage_collection(mode: str, apiserver_factory: ApiServerFactory,
                                                                        start_reconciler: Callable[..., Reconciler]) -> None:
    server = apiserver_factory(MODES[mode])
    admin = server.api_client()
    namespace = new_namespace(admin)
    start_reconciler(namespace, server)
    create(admin, example_job("ray", namespace))
    wait_until(lambda: len(objects(admin, namespace)) == 4, 15, "the job's objects")
    delete(admin, JOB_API_VERSION, "Job", "ray-demo", namespace)
    wait_until(lambda: not objects(admin, namespace), 15, "every object deleted (envtest runs no garbage collector)")


def test_objects_without_our_label_are_left_alone_and_said_so_once(kube_admin: Any, kube_namespace: str,
                                                                   start_reconciler: Callable[..., Reconciler]) -> None:
    create(kube_admin, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "svc-demo-svc", "namespace": kube_namespace},
                        "data": {"volcano": "made me"}})
    reconciler = start_reconciler(kube_namespace)
    create(kube_admin, example_job("svc", kube_namespace))
    wait_until(lambda: {("Service", "svc-demo"), ("NetworkPolicy", "svc-demo")} <= set(objects(kube_admin, kube_namespace)), 15,
               "the Service and NetworkPolicy")
    wait_until(lambda: events(kube_admin, kube_namespace, "ResourceNotManaged"), 10, "a ResourceNotManaged event")
    for _ in range(3):
        resync(reconciler)
        time.sleep(0.3)
    found = events(kube_admin, kube_namespace, "ResourceNotManaged")
    assert len(found) == 1 and "ConfigMap svc-demo-svc" in found[0]["message"]
    assert found[0]["involvedObject"]["name"] == "svc-demo" and found[0]["type"] == "Warning"
    cm = objects(kube_admin, kube_namespace, ours_only=False)[("ConfigMap", "svc-demo-svc")]
    assert cm["data"] == {"volcano": "made me"} and "labels" not in cm["metadata"]
    delete(kube_admin, JOB_API_VERSION, "Job", "svc-demo", kube_namespace)
    wait_until(lambda: set(objects(kube_admin, kube_namespace, ours_only=False)) == {("ConfigMap", "svc-demo-svc")}, 15,
               "ours gone, theirs kept")


def test_ssh_keys_survive_a_restart_and_resyncs(kube_admin: Any, kube_namespace: str, start_reconciler: Callable[..., Reconciler]) -> None:
    first = start_reconciler(kube_namespace)
    create(kube_admin, example_job("ssh", kube_namespace))
    wait_until(lambda: ("Secret", "ssh-demo-ssh") in objects(kube_admin, kube_namespace), 15, "the ssh Secret")
    first.stop()
    secret = objects(kube_admin, kube_namespace)[("Secret", "ssh-demo-ssh")]
    second = start_reconciler(kube_namespace, resync_seconds=0.2)
    time.sleep(1.0)
    second.stop()
    after = objects(kube_admin, kube_namespace)[("Secret", "ssh-demo-ssh")]
    assert after["data"] == secret["data"]
    assert after["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"], "not written at all"


# Drift, and writes that change nothing ------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_drift_is_repaired_from_watch_events(mode: str, apiserver_factory: ApiServerFactory,
                                             start_reconciler: Callable[..., Reconciler]) -> None:
    server = apiserver_factory(MODES[mode])
    admin = server.api_client()
    namespace = new_namespace(admin)
    start_reconciler(namespace, server)  # resync: an hour
    create(admin, example_job("mpi", namespace))
    wait_until(lambda: len(objects(admin, namespace)) == 4, 15, "the job's objects")
    good = objects(admin, namespace)

    def restored(kind: str, name: str, part: str) -> Callable[[], bool]:
        def check() -> bool:
            obj = objects(admin, namespace).get((kind, name))
            return obj is not None and obj[part] == good[(kind, name)][part]
        return check

    delete(admin, "v1", "Service", "mpi-demo", namespace)
    wait_until(restored("Service", "mpi-demo", "spec"), 10, "the deleted Service back")
    delete(admin, "v1", "ConfigMap", "mpi-demo-svc", namespace)
    wait_until(restored("ConfigMap", "mpi-demo-svc", "data"), 10, "the deleted ConfigMap back")
    apply(admin, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mpi-demo-svc", "namespace": namespace},
                  "data": {"VC_MPIWORKER_NUM": "99"}}, field_manager="kubectl-edit")
    wait_until(restored("ConfigMap", "mpi-demo-svc", "data"), 10, "the hand-edited ConfigMap repaired")
    policy = copy.deepcopy(objects(admin, namespace)[("NetworkPolicy", "mpi-demo")])
    policy["spec"]["ingress"] = []
    replace(admin, {**policy, "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"})
    wait_until(restored("NetworkPolicy", "mpi-demo", "spec"), 10, "the NetworkPolicy repaired")
    secret = objects(admin, namespace)[("Secret", "mpi-demo-ssh")]
    delete(admin, "v1", "Secret", "mpi-demo-ssh", namespace)
    wait_until(lambda: ("Secret", "mpi-demo-ssh") in objects(admin, namespace), 10, "the deleted Secret back")
    assert objects(admin, namespace)[("Secret", "mpi-demo-ssh")]["data"]["id_rsa"] == secret["data"]["id_rsa"]


def test_a_steady_state_resync_sends_nothing(envtest: EnvTest, kube_admin: Any, kube_namespace: str,
                                             start_reconciler: Callable[..., Reconciler]) -> None:
    reconciler = start_reconciler(kube_namespace)
    for name in ("mpi", "ray", "svc", "hostfile", "tensorflow", "pytorch"):
        create(kube_admin, example_job(name, kube_namespace))
    # svc's publishNotReadyAddresses: false is stored as nothing; ray's head Service gets ports
    # defaulted (protocol, targetPort); every Service gets type, sessionAffinity, ipFamilies...
    wait_until(lambda: reconciler.metrics.reconciles.labels("success")._value.get() >= 6 and len(reconciler.manager.controllers[0].queue) == 0
               and len(objects(kube_admin, kube_namespace)) >= 18, 20, "every job's objects")
    time.sleep(1.0)  # the last watch events of our own writes
    since = now()
    for _ in range(3):
        assert resync(reconciler) == 6
        wait_until(lambda: len(reconciler.manager.controllers[0].queue) == 0, 10, "the resync done")
        time.sleep(0.3)
    assert product_requests(envtest, since, kube_namespace) == []


# Too large ---------------------------------------------------------------------------------------


class BlobPlugin(Plugin):
    """A third-party plugin whose ConfigMap holds as many bytes as ``--bytes`` says: the built-in
    plugins size their objects themselves (plugins/budget.py), the reconciler keeps the API's limits
    for any plugin."""

    name = "blob"
    flags = (Flag("bytes", "int", 0, "size of the ConfigMap's data"),)

    def resources(self, existing: Any = None) -> list[dict[str, Any]]:
        return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.job.object_meta(f"{self.job.name}-blob"),
                 "data": {"blob": "x" * self.options["bytes"]}}]


def test_an_object_over_its_size_limit_is_never_sent_and_the_job_is_told_once(envtest: EnvTest, kube_admin: Any, kube_namespace: str,
                                                                              start_reconciler: Callable[..., Reconciler]) -> None:
    reconciler = start_reconciler(kube_namespace, chain=Chain(Registry([*BUILTINS.values(), BlobPlugin])))
    since = now()
    job = svc_job(kube_namespace, "big", {"master": 1, "worker": 2})
    job["spec"]["plugins"]["blob"] = [f"--bytes={DATA_LIMIT + 1}"]
    create(kube_admin, job)
    wait_until(lambda: {("ConfigMap", "big-svc"), ("Service", "big"), ("NetworkPolicy", "big")} <= set(objects(kube_admin, kube_namespace)),
               20, "the job's other objects")
    found = wait_until(lambda: events(kube_admin, kube_namespace, "ObjectTooLarge"), 10, "an ObjectTooLarge event")
    message = found[0]["message"]
    assert message == f"ConfigMap big-blob not written: its data is {DATA_LIMIT + 1} bytes, over the {DATA_LIMIT}-byte limit on a ConfigMap's data"
    assert found[0]["involvedObject"]["name"] == "big" and found[0]["type"] == "Warning"
    for _ in range(3):
        resync(reconciler)
        time.sleep(0.5)
    assert len(events(kube_admin, kube_namespace, "ObjectTooLarge")) == 1, "told once, not on every resync"
    asked = product_requests(envtest, since, kube_namespace)
    assert [r for r in asked if r[2] == "big-blob"] == [], "nothing sent for the ConfigMap"
    assert len([r for r in asked if r[0] in WRITES and r[1] != "events"]) == 3, "one create each for the other objects"
    # Once the job fits, the ConfigMap is made.
    scale(kube_admin, kube_namespace, "big", lambda job: job["spec"]["plugins"].update(blob=["--bytes=10"]))
    wait_until(lambda: ("ConfigMap", "big-blob") in objects(kube_admin, kube_namespace), 15, "the ConfigMap once the job fits")


def test_a_job_the_plugins_refuse_is_told_once_and_left_alone(kube_admin: Any, kube_namespace: str,
                                                              start_reconciler: Callable[..., Reconciler]) -> None:
    reconciler = start_reconciler(kube_namespace)
    job = example_job("env", kube_namespace)
    job["spec"]["plugins"]["nope"] = []
    create(kube_admin, job)
    found = wait_until(lambda: events(kube_admin, kube_namespace, "InvalidPlugins"), 10, "an InvalidPlugins event")
    assert "nope" in found[0]["message"]
    resync(reconciler)
    time.sleep(0.5)
    assert len(events(kube_admin, kube_namespace, "InvalidPlugins")) == 1
    assert objects(kube_admin, kube_namespace) == {}


# Leadership and stopping --------------------------------------------------------------------------


def test_a_standby_never_writes_and_takes_over_at_once_when_the_leader_stops(envtest: EnvTest, kube_admin: Any, kube_namespace: str,
                                                                             start_reconciler: Callable[..., Reconciler]) -> None:
    from volcano_job_webhook.reconciler.leader import LeaderElector

    lease = LEASE
    delete(kube_admin, "coordination.k8s.io/v1", "Lease", *lease)
    electors: dict[str, LeaderElector] = {}
    reconcilers: dict[str, Reconciler] = {}
    changes: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def on_change(name: str) -> Callable[[bool], None]:
        def changed(leading: bool) -> None:
            with lock:
                changes.append((name, leading))
            if leading:
                wait_until(lambda: name in reconcilers, 15, f"{name}'s reconciler")
                reconcilers[name].manager.lead()
        return changed

    # b's clock stands still: a's Lease never expires for b, so b can only lead once a releases it.
    clocks: dict[str, Callable[[], float]] = {"a": time.monotonic, "b": FakeClock()}
    for name in ("a", "b"):
        electors[name] = LeaderElector(envtest.api_client(WEBHOOK_USER), *lease, name, lease_duration=3, renew_deadline=2,
                                       retry_period=0.3, on_change=on_change(name), clock=clocks[name])
    electors["a"].start()
    wait_until(lambda: electors["a"].is_leader, 10, "a leads")
    electors["b"].start()
    for name in ("a", "b"):
        reconcilers[name] = start_reconciler(kube_namespace, leading=False)
    create(kube_admin, example_job("svc", kube_namespace))
    wait_until(lambda: len(objects(kube_admin, kube_namespace)) == 3, 15, "a makes the objects")
    time.sleep(0.5)
    assert not electors["b"].is_leader
    assert sent(reconcilers["b"]) == 0, "the standby sent nothing"
    assert sent(reconcilers["a"]) > 0
    # a stops as on SIGTERM (or a lost Lease, which ends the process): its Lease is released and b
    # leads without waiting it out.
    reconcilers["a"].stop()
    electors["a"].stop()
    wait_until(lambda: electors["b"].is_leader, 10, "b takes over")
    delete(kube_admin, JOB_API_VERSION, "Job", "svc-demo", kube_namespace)
    wait_until(lambda: not objects(kube_admin, kube_namespace), 15, "b cleans up")
    electors["b"].stop()
    holding: set[str] = set()
    for name, leading in changes:
        assert not (leading and holding), f"{name} led while {holding} did"
        (holding.add if leading else holding.discard)(name)


def test_leadership_gained_just_after_the_caches_sync_reconciles_everything(kube_admin: Any, kube_namespace: str,
                                                                            start_reconciler: Callable[..., Reconciler]) -> None:
    for name in ("svc", "ssh"):
        create(kube_admin, example_job(name, kube_namespace))
    reconciler = start_reconciler(kube_namespace, leading=False)
    time.sleep(0.005)
    reconciler.manager.lead()
    wait_until(lambda: len(objects(kube_admin, kube_namespace)) == 7, 15, "both jobs' objects")


LEASE = ("volcano-job-webhook-reconciler", "volcano-job-webhook")  # the one Lease the Role allows


def leading_command(envtest: EnvTest, kube_admin: Any, namespace: str, tmp_path: Path) -> Any:
    """``volcano-webhook reconcile --leader-elect`` as the install runs it, once it is ready and leading."""
    delete(kube_admin, "coordination.k8s.io/v1", "Lease", *LEASE)
    port = free_port()
    process = start_product(["reconcile", f"--kubeconfig={envtest.kubeconfig(WEBHOOK_USER)}", f"--namespace={namespace}",
                             f"--health-port={port}", "--leader-elect", f"--lease-name={LEASE[0]}",
                             f"--lease-namespace={LEASE[1]}", "--workers=2"], tmp_path / "reconcile.log")

    def ready() -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                body: dict[str, Any] = json.loads(response.read())
                return body if body.get("leader") else None
        except OSError:
            return None

    try:
        wait_until(ready, 30, f"the reconciler ready and leading:\n{process.log(tail=20)}")
    except BaseException:
        process.stop()
        raise
    return process


def test_the_reconcile_command_releases_its_lease_and_exits_promptly_on_sigterm(envtest: EnvTest, kube_admin: Any,
                                                                                 kube_namespace: str, tmp_path: Path) -> None:
    process = leading_command(envtest, kube_admin, kube_namespace, tmp_path)
    try:
        # Named in our annotation: the command leaves spec.plugins to Volcano's own controller.
        create(kube_admin, annotated(example_job("svc", kube_namespace)))
        wait_until(lambda: len(objects(kube_admin, kube_namespace)) == 3, 15, "the job's objects")
        time.sleep(1.0)  # its watches are open and idle: stopping must not wait for their next event
        process.popen.send_signal(signal.SIGTERM)
        # Within half the 20 s a watch left to time out would take; bench/reconcile.py measures the
        # exit against its 2 s target.
        assert process.popen.wait(10) == 0, process.log(tail=20)
    finally:
        process.stop()
    held = read(kube_admin, "coordination.k8s.io/v1", "Lease", *LEASE)
    assert held is not None and not held["spec"].get("holderIdentity"), "the Lease released for a standby"


def test_the_reconcile_command_exits_non_zero_when_it_loses_its_lease(envtest: EnvTest, kube_admin: Any,
                                                                       kube_namespace: str, tmp_path: Path) -> None:
    """As controller-runtime: a replica whose Lease another took ends (the Deployment starts it again,
    as a candidate), so no write path needs to ask whether it still leads."""
    process = leading_command(envtest, kube_admin, kube_namespace, tmp_path)
    try:
        lease = read(kube_admin, "coordination.k8s.io/v1", "Lease", *LEASE)
        assert lease is not None
        lease["spec"].update(holderIdentity="another", renewTime=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        replace(kube_admin, {**lease, "apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})
        assert process.popen.wait(15) == 1, process.log(tail=20)
        assert "lost the Lease" in process.log(tail=20)
    finally:
        process.stop()


# The caches as records (webhook/kube/records.py, reconciler/owned.py) -----------------------------


def test_a_finished_job_keeps_no_objects_and_gets_none_again(envtest: EnvTest, kube_admin: Any, kube_namespace: str,
                                                             start_reconciler: Callable[..., Reconciler]) -> None:
    """Completed (Volcano's controller writes it through the status subresource): our objects go, as
    Volcano's own do, and later status writes make nothing again — no object, no key."""
    start_reconciler(kube_namespace)
    create(kube_admin, example_job("mpi", kube_namespace))
    wait_until(lambda: len(objects(kube_admin, kube_namespace)) == 4, 15, "the job's objects")
    status_path = resource_path(kube_admin, JOB_API_VERSION, "Job", kube_namespace, "mpi-demo") + "/status"
    request(kube_admin, "PATCH", status_path, body={"status": {"state": {"phase": "Completed"}}},
            content_type="application/merge-patch+json")
    wait_until(lambda: not objects(kube_admin, kube_namespace), 15, "the finished job's objects gone")
    since = now()
    for succeeded in (1, 2, 3):
        request(kube_admin, "PATCH", status_path, body={"status": {"succeeded": succeeded}}, content_type="application/merge-patch+json")
    time.sleep(1.0)
    assert not objects(kube_admin, kube_namespace)
    assert [r for r in product_requests(envtest, since, kube_namespace) if r[0] in WRITES] == []


def test_a_resumed_watch_repairs_what_changed_while_the_reconciler_was_cut_off(envtest: EnvTest, kube_admin: Any, kube_namespace: str,
                                                                         start_reconciler: Callable[..., Reconciler]) -> None:
    """Its watches broken (a TCP proxy between it and the API server cut), then mended: the informers
    resume their watches at the last version each saw, the API server replays what changed meanwhile —
    a ConfigMap edited, a Service deleted — and it is repaired, with no LIST (client-go's reflector)."""
    from urllib.parse import urlsplit

    from tests.helpers.servers import TcpProxy

    address = urlsplit(envtest.host)
    proxy = TcpProxy((address.hostname or "127.0.0.1", address.port or 443))
    try:
        api = envtest.api_client(WEBHOOK_USER)
        api.configuration.host = f"https://127.0.0.1:{proxy.port}"
        reconciler = Reconciler(api, WebhookSettings(namespaces=[kube_namespace], resync_seconds=3600, workloads=[]), Chain())
        reconciler.start()
        try:
            wait_until(lambda: reconciler.manager.ready, 15, "the reconciler's caches to sync")
            create(kube_admin, example_job("mpi", kube_namespace))
            wait_until(lambda: len(objects(kube_admin, kube_namespace)) == 4, 15, "the job's objects")
            hosts = dict(objects(kube_admin, kube_namespace)[("ConfigMap", "mpi-demo-svc")]["data"])
            cut = now()
            proxy.cut()
            cm = read(kube_admin, "v1", "ConfigMap", "mpi-demo-svc", kube_namespace)
            assert cm is not None
            cm["data"]["mpiworker.host"] = "intruder\n"
            replace(kube_admin, cm)
            delete(kube_admin, "v1", "Service", "mpi-demo", kube_namespace)
            time.sleep(1.0)
            proxy.mend()

            def repaired() -> bool:
                got = objects(kube_admin, kube_namespace)
                return ("Service", "mpi-demo") in got and got[("ConfigMap", "mpi-demo-svc")]["data"] == hosts
            wait_until(repaired, 30, "the edit and the deletion repaired from the resumed watches")
            time.sleep(0.5)  # the audit log is written as requests complete
            assert [r for r in product_requests(envtest, cut, kube_namespace) if r[0] == "list"] == [], "no cache listed again"
        finally:
            reconciler.stop()
    finally:
        proxy.close()
