"""Beside a running Volcano (docs/install.md#who-runs-what): the plugins Volcano's own controller
runs are its — their Pod wiring, their side objects, and whatever we would refuse of them — and
ours are ours. The chain, the admission handlers and the reconciler, each on the cases that decide
who does what. Why the API double: a job made again runs on it and on kube-apiserver (coverage
without the real parts), and a replica that stops leading is seen through injected 503s and the
double's request log (fault injection). The reconciler beside Volcano's own controller is
tests/apiserver/test_beside_volcano_scenarios.py."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.cluster import SERVERS, ServerNamespace, api_server, kind_path
from tests.helpers.envtest import create, delete, request, wait_until
from tests.helpers.jobs import API_VERSION, volcano_job
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain, ChainConfig, Job, PluginError
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL, VOLCANO_PLUGINS
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.reconciler import Reconciler
from volcano_job_webhook.server.admission import admission_review, read_review
from volcano_job_webhook.server.handlers import JobCache, JobValidator, PodMutator
from volcano_job_webhook.server.metrics import WebhookMetrics

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
    assert ALONE.prepare(twice).plugins[0].peers["svc"] == ["--disable-network-policy"], "alone, the annotation wins as before"


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

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: Any = None) -> dict[str, Any] | None:
        if self.error is not None:
            raise self.error
        return self.obj


def mutate(obj: dict[str, Any] | None, pod: dict[str, Any], *, audit: bool = False, error: Exception | None = None) -> Any:
    import asyncio

    handler = PodMutator(OneJob(obj, error), JobCache(BESIDE), WebhookMetrics(), audit=audit)
    return asyncio.run(handler(read_review(admission_review(pod, uid="u")).request))


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
    return asyncio.run(JobValidator(BESIDE, audit=audit)(read_review(review).request))


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


# The reconciler ------------------------------------------------------------------------------------


wait_for = functools.partial(wait_until, timeout=10.0, interval=0.02)

SIDE_KINDS = ("ConfigMap", "Service", "Secret", "NetworkPolicy")


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerNamespace]:
    with api_server(request.param, request) as found:
        yield found


def ours(server: ServerNamespace) -> dict[tuple[str, str], dict[str, Any]]:
    """The reconciler's objects in the namespace (its label), by kind and name."""
    return {(kind, o["metadata"]["name"]): o for kind in SIDE_KINDS
            for o in request(server.admin, "GET", kind_path(server.admin, kind, server.namespace), query=[("labelSelector", f"{MANAGED_BY_LABEL}={MANAGED_BY}")])["items"]}


def test_a_job_made_again_while_the_reconciler_was_away_gets_new_objects_and_a_new_key(server: ServerNamespace):
    """The reconciler stopped, the Job deleted and made again under its name: when the reconciler is
    back its predecessor's objects may still be there (no garbage collector, or a slow one), and
    they are replaced, never adopted — a new Job never inherits a key."""
    ns = server.namespace
    made = functools.partial(job, namespace=ns, uid=None, plugins={}, annotation={"mpi": []})
    first = create(server.admin, made())
    reconciler = Reconciler(server.admin, WebhookSettings(namespaces=[ns], resync_seconds=3600, workloads=[]), BESIDE)
    reconciler.start()
    try:
        wait_for(lambda: ("Secret", "demo-ssh") in ours(server), what="the first Secret")
    finally:
        reconciler.stop()
    old_key = ours(server)[("Secret", "demo-ssh")]["data"]["id_rsa"]
    delete(server.admin, API_VERSION, "Job", "demo", ns)
    second = create(server.admin, made())
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    again = Reconciler(server.admin, WebhookSettings(namespaces=[ns], resync_seconds=3600, workloads=[]), BESIDE)
    again.start()
    try:
        def renewed() -> bool:
            secret = ours(server).get(("Secret", "demo-ssh"))
            return bool(secret) and secret["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]
        wait_for(renewed, what="the new Job's Secret")
        live = ours(server)
        assert live[("Secret", "demo-ssh")]["data"]["id_rsa"] != old_key, "a new Job never inherits its predecessor's key"
        for (kind, name), obj in live.items():
            refs = obj["metadata"]["ownerReferences"]
            assert [r["uid"] for r in refs] == [second["metadata"]["uid"]], f"{kind} {name}: one controller, the new Job"
    finally:
        again.stop()


def test_a_reconciler_that_stops_sends_no_more_retries(api_double: FakeApiServer):
    """Stopped (SIGTERM, or a lost Lease, which ends the process): a failing write is not tried again."""
    r = Reconciler(api_double.api_client(), WebhookSettings(resync_seconds=3600, workloads=[]), BESIDE)
    api_double.fail_next(100, status=503, method="POST", path_contains="/configmaps")
    r.start()
    try:
        body = job(plugins={}, annotation={"hostfile": []}, uid=None)
        client.CustomObjectsApi(api_double.api_client()).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", body)
        wait_for(lambda: [q for q in api_double.requests if q.resource == "configmaps" and q.verb == "create"], what="a first attempt")
        r.stop()
        time.sleep(0.05)  # an attempt may be on the wire as it stops
        sent = len([q for q in api_double.requests if q.resource == "configmaps" and q.verb == "create"])
        time.sleep(1.5)  # the retries' backoff would have sent more by now
        assert len([q for q in api_double.requests if q.resource == "configmaps" and q.verb == "create"]) == sent
    finally:
        r.stop()
