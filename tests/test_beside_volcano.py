"""Beside a running Volcano (docs/install.md#who-runs-what): the plugins Volcano's own controller
runs are its — their Pod wiring, their side objects, and whatever we would refuse of them — and
ours are ours. The chain, the admission handlers and the reconciler (against the API double), each
on the cases that decide who does what."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.apiserver import FakeApiServer
from tests.envtest import wait_until
from tests.jobs import volcano_job
from volcano_job_webhook.plugins import Chain, ChainConfig, Job, PluginError
from volcano_job_webhook.plugins.keys import VOLCANO_PLUGINS
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.reconciler import Reconciler
from volcano_job_webhook.server.handlers import JobCache, JobValidator, PodMutator
from volcano_job_webhook.server.metrics import WebhookMetrics
from volcano_job_webhook.server.review import admission_review, parse_review

BESIDE = Chain(config=ChainConfig(volcano_plugins=frozenset(VOLCANO_PLUGINS)))
ALONE = Chain()
UID = "9d0e1f3a-0000-4000-8000-000000000001"


# The job of every case here: master 1, worker 2; what differs is which plugins it names where.
job = functools.partial(volcano_job, "demo", uid=UID, image="busybox", plugins={})


def kinds_and_names(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


# The chain --------------------------------------------------------------------------------------


def test_who_runs_what():
    both = Job.from_object(job(plugins={"svc": [], "ssh": []}, annotation={"torchrun": []}))
    assert BESIDE.volcano_runs(both) == {"svc", "ssh"}
    assert ALONE.volcano_runs(both) == set(), "with no Volcano controller configured, everything is ours"
    # What Volcano's status records as run is Volcano's, whatever we were told.
    recorded = Job.from_object(job(plugins={"svc": [], "ssh": []}, status={"controlledResources": {"plugin-svc": "svc"}}))
    assert ALONE.volcano_runs(recorded) == {"svc"}


def test_only_our_plugins_make_objects_and_a_dependency_volcano_runs_is_volcanos():
    # torchrun brings in svc; spec.plugins names svc, so Volcano's controller makes svc's objects.
    shared = Job.from_object(job(plugins={"svc": [], "ssh": []}, annotation={"hostfile": []}))
    assert kinds_and_names(BESIDE.resources(shared)) == {("ConfigMap", "demo-hostfile")}
    assert kinds_and_names(ALONE.resources(shared)) == {
        ("ConfigMap", "demo-hostfile"), ("ConfigMap", "demo-svc"), ("Service", "demo"),
        ("NetworkPolicy", "demo"), ("Secret", "demo-ssh")}
    # No svc in spec.plugins: the svc our plugin brings in is ours to run.
    ours = Job.from_object(job(plugins={}, annotation={"hostfile": []}))
    assert ("ConfigMap", "demo-svc") in kinds_and_names(BESIDE.resources(ours))


def test_a_flag_volcano_ignores_is_a_warning_for_pods_and_an_error_for_a_new_job():
    bad = Job.from_object(job(plugins={"svc": ["--publish-not-ready-addresses", "--no-such-flag", "--disable-network-policy"]}))
    with pytest.raises(PluginError, match=r"plugin svc: --no-such-flag: flag provided but not defined"):
        BESIDE.check(bad)  # /validate of a CREATE judges every plugin
    prepared = BESIDE.prepare(bad)
    (warning,) = [w for w in prepared.warnings if "no-such-flag" in w]
    assert "Volcano's controller only logs this and runs the plugin with the 1 argument(s) before it" in warning
    # Go's flag package keeps what it parsed before the bad flag, and nothing after it.
    (svc,) = prepared.plugins
    assert svc.options["publish-not-ready-addresses"] is True and svc.options["disable-network-policy"] is False
    # The plugin is Volcano's: for a Pod Volcano's controller made, nothing of it is applied again.
    pod = make_pod(bad, "worker", 0)
    assert prepared.mutate(pod, volcano_wired=True).pod == pod
    # The offline rendering (volcano_wired=False) shows what Volcano's controller does with it.
    assert prepared.mutate(pod).pod["spec"]["subdomain"] == "demo"


def test_a_volcano_plugin_we_would_refuse_is_never_applied_by_us():
    # mpi without its master task: Volcano's controller runs it anyway; we warn and leave it be.
    no_master = Job.from_object(job(plugins={"mpi": [], "ssh": [], "svc": []}, tasks=(("worker", 2),)))
    with pytest.raises(PluginError, match="plugin mpi"):
        BESIDE.check(no_master)
    prepared = BESIDE.prepare(no_master)
    assert "mpi" in prepared.failed and any("plugin mpi" in w for w in prepared.warnings)
    offline = prepared.mutate(make_pod(no_master, "worker", 0))
    assert "mpi" not in offline.plugins and "svc" in offline.plugins


def test_our_plugins_are_judged_strictly_beside_volcano():
    ours_bad = Job.from_object(job(plugins={"svc": []}, annotation={"torchrun": ["--nproc-per-node=lots"]}))
    with pytest.raises(PluginError, match="plugin torchrun: --nproc-per-node"):
        BESIDE.prepare(ours_bad)


def test_the_annotation_cannot_reconfigure_a_plugin_volcano_runs():
    twice = Job.from_object(job(plugins={"svc": []}, annotation={"svc": ["--disable-network-policy"]}))
    with pytest.raises(PluginError, match=r"names plugin svc again with other arguments"):
        BESIDE.check(twice)
    prepared = BESIDE.prepare(twice)
    assert any("names plugin svc again" in w for w in prepared.warnings)
    (svc,) = prepared.plugins
    assert svc.options["disable-network-policy"] is False, "spec.plugins' arguments are what Volcano runs"
    assert ALONE.plugin_args(twice)["svc"] == ["--disable-network-policy"], "alone, the annotation wins as before"


def test_a_mount_clash_between_volcano_and_us_is_ours_to_refuse():
    clash = Job.from_object(job(plugins={"svc": []}, annotation={"hostfile": ["--path=/etc/volcano"]}))
    with pytest.raises(PluginError, match=r"plugin hostfile: --path: mounts volume 'demo-hostfile' at '/etc/volcano', where plugin svc"):
        BESIDE.prepare(clash)


# Admission --------------------------------------------------------------------------------------


class OneJob:
    """A job source holding one Job, or failing every lookup."""

    def __init__(self, obj: dict[str, Any] | None, error: Exception | None = None) -> None:
        self.obj, self.error, self.ready = obj, error, True

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def status(self) -> dict[str, Any]:
        return {}

    def __len__(self) -> int:
        return 1

    async def get(self, namespace: str, name: str, uid: str | None = None) -> dict[str, Any] | None:
        if self.error is not None:
            raise self.error
        return self.obj


def mutate(obj: dict[str, Any] | None, pod: dict[str, Any], *, audit: bool = False, error: Exception | None = None) -> Any:
    import asyncio

    handler = PodMutator(OneJob(obj, error), JobCache(BESIDE), WebhookMetrics(), audit=audit)
    return asyncio.run(handler(parse_review(admission_review(pod, uid="u"))))


def test_a_pod_of_a_job_with_a_flag_volcano_ignores_is_admitted_with_a_warning():
    obj = job(plugins={"svc": ["--no-such-flag"]})
    answer = mutate(obj, make_pod(Job.from_object(obj), "worker", 1))
    assert answer.allowed and not answer.patch
    assert any("--no-such-flag" in w for w in answer.warnings)


def test_a_pod_is_wired_with_our_plugins_only():
    obj = job(plugins={"svc": []}, annotation={"torchrun": []})
    pod = make_pod(Job.from_object(obj), "worker", 1)
    answer = mutate(obj, pod)
    assert answer.allowed and answer.patch
    touched = {op["path"] for op in answer.patch}
    assert "/spec/containers/0/env" in touched
    env = next(op["value"] for op in answer.patch if op["path"] == "/spec/containers/0/env")
    names = {e["name"] for e in env}
    assert "PET_NNODES" in names and not names & {"VC_MASTER_HOSTS", "VC_WORKER_HOSTS"}, "svc's variables are Volcano's to add"
    assert "/spec/subdomain" not in touched


def test_our_refusal_denies_and_audit_mode_warns_instead():
    obj = job(plugins={}, annotation={"torchrun": ["--nproc-per-node=lots"]})
    pod = make_pod(Job.from_object(obj), "worker", 0)
    denied = mutate(obj, pod)
    assert not denied.allowed and denied.code == 403 and "plugin torchrun: --nproc-per-node" in denied.message
    audited = mutate(obj, pod, audit=True)
    assert audited.allowed and not audited.patch
    assert audited.warnings[0].startswith("volcano-job-webhook (audit): would deny: job default/demo: plugin torchrun")


def test_a_failed_lookup_is_an_error_never_an_unwired_pod():
    obj = job(plugins={}, annotation={"torchrun": []})
    answer = mutate(None, make_pod(Job.from_object(obj), "worker", 0), error=client.ApiException(status=503))
    assert not answer.allowed and answer.code == 500
    assert answer.message.startswith("volcano-job-webhook: could not look up job default/demo (HTTP 503)")


def validate(obj: dict[str, Any], old: dict[str, Any] | None = None, *, audit: bool = False) -> Any:
    import asyncio

    review = admission_review(obj, uid="v", operation="UPDATE" if old is not None else "CREATE", old=old)
    return asyncio.run(JobValidator(BESIDE, audit=audit)(parse_review(review)))


def test_validate_judges_a_create_whole():
    answer = validate(job(plugins={"svc": ["--no-such-flag"]}))
    assert not answer.allowed and "--no-such-flag" in answer.message
    audited = validate(job(plugins={"svc": ["--no-such-flag"]}), audit=True)
    assert audited.allowed and "would deny" in audited.warnings[0]


def test_validate_judges_an_update_only_on_what_it_changes():
    running = job(plugins={"svc": ["--no-such-flag"]}, status={"state": {"phase": "Running"}})
    labelled = json.loads(json.dumps(running))
    labelled["metadata"]["labels"] = {"team": "a"}
    assert validate(labelled, running).allowed, "kubectl label on a job Volcano tolerates"
    scaled = json.loads(json.dumps(running))
    scaled["spec"]["tasks"][1]["replicas"] = 3
    kept = validate(scaled, running)
    assert kept.allowed and "already so before this update" in kept.warnings[0], "an old problem is not this update's"
    worse = json.loads(json.dumps(running))
    worse["spec"]["plugins"]["svc"] = ["--publish-not-ready-addresses=maybe"]
    refused = validate(worse, running)
    assert not refused.allowed and "--publish-not-ready-addresses" in refused.message
    deleting = json.loads(json.dumps(worse))
    deleting["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    assert validate(deleting, running).allowed, "a Job being deleted is never refused"


# The reconciler against the API double ----------------------------------------------------------


wait_for = functools.partial(wait_until, timeout=10.0, interval=0.02)


OBJECTS = {"configmaps": "ConfigMap", "services": "Service", "secrets": "Secret", "networkpolicies.networking.k8s.io": "NetworkPolicy"}


def objects(server: FakeApiServer) -> dict[tuple[str, str], dict[str, Any]]:
    return {(kind, o["metadata"]["name"]): o for resource, kind in OBJECTS.items() for o in server.objects(resource)}


@pytest.fixture
def reconciler(api_double: FakeApiServer) -> Iterator[Reconciler]:
    r = Reconciler(api_double.api_client(), BESIDE, resync_seconds=3600)
    r.start()
    yield r
    r.stop()


def jobs(server: FakeApiServer) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(server.api_client())


def create(server: FakeApiServer, obj: dict[str, Any]) -> dict[str, Any]:
    body = json.loads(json.dumps(obj))
    body["metadata"].pop("uid", None)
    return jobs(server).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", body)


def patch_status(server: FakeApiServer, name: str, body: dict[str, Any]) -> None:
    jobs(server).patch_namespaced_custom_object_status("batch.volcano.sh", "v1alpha1", "default", "jobs", name, body)


def test_the_reconciler_makes_only_what_we_run(api_double: FakeApiServer, reconciler: Reconciler):
    create(api_double, job(plugins={"svc": [], "ssh": []}, annotation={"hostfile": []}))
    wait_for(lambda: ("ConfigMap", "demo-hostfile") in objects(api_double), what="the hostfile ConfigMap")
    time.sleep(0.3)
    assert set(objects(api_double)) == {("ConfigMap", "demo-hostfile")}, "svc's and ssh's objects are Volcano's"


def test_a_job_made_again_under_the_same_name_gets_new_objects_and_a_new_key(api_double: FakeApiServer, reconciler: Reconciler):
    first = create(api_double, job(plugins={}, annotation={"mpi": []}))
    wait_for(lambda: ("Secret", "demo-ssh") in objects(api_double), what="the first Secret")
    old_key = objects(api_double)[("Secret", "demo-ssh")]["data"]["id_rsa"]
    # No garbage collector here (as with GC slow or off): the old Job's objects are still there
    # when the new Job comes, and must not be adopted.
    reconciler.stop()
    jobs(api_double).delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "demo")
    second = create(api_double, job(plugins={}, annotation={"mpi": []}))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    again = Reconciler(api_double.api_client(), BESIDE, resync_seconds=3600)
    again.start()
    try:
        def renewed() -> bool:
            secret = objects(api_double).get(("Secret", "demo-ssh"))
            return bool(secret) and secret["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]
        wait_for(renewed, what="the new Job's Secret")
        live = objects(api_double)
        assert live[("Secret", "demo-ssh")]["data"]["id_rsa"] != old_key, "a new Job never inherits its predecessor's key"
        for (kind, name), obj in live.items():
            refs = obj["metadata"]["ownerReferences"]
            assert [r["uid"] for r in refs] == [second["metadata"]["uid"]], f"{kind} {name}: one controller, the new Job"
    finally:
        again.stop()


def test_a_finished_job_keeps_nothing_and_gets_nothing_new(api_double: FakeApiServer, reconciler: Reconciler):
    create(api_double, job(plugins={}, annotation={"mpi": []}))
    wait_for(lambda: ("Secret", "demo-ssh") in objects(api_double), what="the job's objects")
    patch_status(api_double, "demo", {"status": {"state": {"phase": "Completed"}}})
    wait_for(lambda: not objects(api_double), what="the finished job's objects gone")
    api_double.clear_requests()
    patch_status(api_double, "demo", {"status": {"state": {"phase": "Completed"}, "succeeded": 3}})
    reconciler.resync()
    time.sleep(0.3)
    assert not objects(api_double) and not [q for q in api_double.requests if q.verb == "create"], "no new objects, no new keys"


def test_a_replica_that_stops_leading_sends_no_more_retries(api_double: FakeApiServer):
    leading = threading.Event()
    leading.set()
    r = Reconciler(api_double.api_client(), BESIDE, resync_seconds=3600, is_leader=leading.is_set)
    api_double.fail_next(100, status=503, method="POST", path_contains="/configmaps")
    r.start()
    try:
        create(api_double, job(plugins={}, annotation={"hostfile": []}))
        wait_for(lambda: [q for q in api_double.requests if q.resource == "configmaps" and q.verb == "create"], what="a first attempt")
        leading.clear()
        time.sleep(0.05)  # an attempt may be on the wire as leadership goes
        sent = len([q for q in api_double.requests if q.resource == "configmaps" and q.verb == "create"])
        time.sleep(1.5)  # the retries' backoff would have sent more by now
        assert len([q for q in api_double.requests if q.resource == "configmaps" and q.verb == "create"]) == sent
    finally:
        r.stop()
