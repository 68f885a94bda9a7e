"""The product behind a real kube-apiserver: Pods and Jobs go through admission and come back wired.

``python -m volcano_job_webhook serve --job-source=kube`` runs as a subprocess, as token user
``volcano-job-webhook`` holding exactly the RBAC that manifests/ grant its ServiceAccount, with the
serving certificate it makes itself. The manifests' MutatingWebhookConfiguration and
ValidatingWebhookConfiguration are registered with ``clientConfig.url`` pointing at it. The test
then creates Volcano Jobs and their Pods (as Volcano's job controller builds them, ``make_pod``) as
the admin, and compares what the API server stored with what the plugin chain makes of the same
Pod offline.

The offline expectation has to go through the API server too, without the webhook: the webhook
sees a Pod after defaulting and the built-in admission plugins (the ServiceAccount plugin adds the
``kube-api-access-*`` token volume and mounts), and its patch is defaulted again afterwards (e.g.
``protocol: TCP`` on an added port). So: dry-run the Pod without the ``volcano.sh/job-name`` label
(the objectSelector then keeps the webhook out), run ``Chain().mutate`` on that, dry-run the result
the same way, and compare it with the Pod created for real through the webhook.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client as kube_client
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import (
    JOB_API_VERSION,
    WEBHOOK_USER,
    AuditEvent,
    EnvTest,
    Process,
    apply,
    create,
    delete,
    new_namespace,
    read,
    replace,
    request,
    serving_webhook,
    status_message,
    wait_until,
    webhook_configurations,
)
from tests.helpers.jobs import example_job
from tests.helpers.manifests_util import rbac_permissions
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.keys import JOB_NAME_KEY
from volcano_job_webhook.plugins.podgen import make_pod

EXAMPLE_JOBS = sorted((EXAMPLES / "jobs").glob("*-job.yaml"))
MUTATING_HOOK, VALIDATING_HOOK = "pods.volcano-job-webhook.io", "jobs.volcano-job-webhook.io"
BAD_PORT = "--port=70000"


def bad_job(namespace: str, name: str) -> dict[str, Any]:
    """The pytorch example with a port no TCP socket can have."""
    job = example_job("pytorch", namespace)
    job["metadata"]["name"] = name
    job["spec"]["plugins"]["pytorch"] = ["--master=master", "--worker=worker", BAD_PORT]
    return job


def offline_error(job: Job, pod: Mapping[str, Any] | None = None) -> str:
    """The message the chain fails with offline: ``mutate`` for a Pod, else ``check`` for the Job."""
    with pytest.raises(PluginError) as info:
        if pod is None:
            Chain().check(job)
        else:
            Chain().mutate(job, dict(pod))
    return str(info.value)


def denied(hook: str, message: str) -> str:
    """The API server's message for a webhook's denial."""
    return f'admission webhook "{hook}" denied the request: {message}'


# The product and its registration ----------------------------------------------------------------


@dataclass
class Webhook:
    process: Process
    base_url: str
    ca_bundle: bytes
    started: datetime  # before the process started: its requests in the audit log come after


@dataclass
class Registered:
    webhook: Webhook
    stale_job: dict[str, Any]  # a Job with a bad argument, stored before the validating webhook existed


@pytest.fixture(scope="module")
def webhook(envtest: EnvTest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """``serve --job-source=kube`` as user volcano-job-webhook, ready (its Job cache synced).

    No Volcano controller runs beside this API server: the Pods are the test's, made as Volcano's
    controller builds them but not wired by its plugins, so the webhook is told to run every plugin
    (``volcano_controller_plugins: []``, docs/install.md#who-runs-what). The scenarios beside
    Volcano's own controller are tests/apiserver/test_beside_volcano_scenarios.py."""
    workdir = tmp_path_factory.mktemp("webhook")
    config = workdir / "config.yaml"
    config.write_text("volcano_controller_plugins: []\n", encoding="utf-8")
    started = datetime.now(UTC)
    with serving_webhook(workdir, envtest.kubeconfig(WEBHOOK_USER), f"--config={config}") as served:
        serving = x509.load_pem_x509_certificate((workdir / "certs" / "tls.crt").read_bytes())
        ips = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
        assert "127.0.0.1" in {str(ip) for ip in ips}, "the API server calls https://127.0.0.1:PORT"
        yield Webhook(served.process, served.base_url, served.ca_bundle, started)


def dry_run_error(api: kube_client.ApiClient, obj: Mapping[str, Any]) -> str | None:
    """The API server's message when a dry-run create of ``obj`` fails, None when it would succeed."""
    try:
        create(api, obj, dry_run=True)
    except ApiException as exc:
        return status_message(exc)
    return None


@pytest.fixture(scope="module")
def registered(webhook: Webhook, envtest: EnvTest, kube_admin: kube_client.ApiClient) -> Iterator[Registered]:
    """The manifests' webhook configurations registered and in effect.

    A Job with a bad plugin argument is stored first, while only the mutating webhook is
    registered: such Jobs exist in a real cluster too (created before the install, or while the
    validating webhook, which fails open, was unreachable), and their Pods must still be denied.
    Each registration is polled until the API server acts on it (about a second). Both are deleted
    at the end: the API server is shared by the session and the mutating webhook fails closed.
    """
    configs = {c["kind"]: c for c in webhook_configurations(webhook.base_url, webhook.ca_bundle)}
    mutating, validating = configs["MutatingWebhookConfiguration"], configs["ValidatingWebhookConfiguration"]
    namespace = new_namespace(kube_admin, "stale-")
    try:
        stale = create(kube_admin, bad_job(namespace, "stale"))
        stale_pod = make_pod(Job.from_object(stale), "worker", 0)
        apply(kube_admin, mutating)

        def in_effect(obj: Mapping[str, Any], hook: str) -> bool:
            message = dry_run_error(kube_admin, obj)
            if message is not None and "failed calling webhook" in message:
                raise AssertionError(f"{message}\n{webhook.process.log(tail=40)}")
            return message is not None and message.startswith(f'admission webhook "{hook}" denied')

        wait_until(lambda: in_effect(stale_pod, MUTATING_HOOK), 20, "the MutatingWebhookConfiguration to take effect")
        apply(kube_admin, validating)
        wait_until(lambda: in_effect(bad_job(namespace, "probe"), VALIDATING_HOOK), 20,
                   "the ValidatingWebhookConfiguration to take effect")
        yield Registered(webhook, stale)
    finally:
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            delete(kube_admin, "admissionregistration.k8s.io/v1", kind, configs[kind]["metadata"]["name"])


# Normalising what the API server returns -----------------------------------------------------------

SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields")
TOKEN_VOLUME_PREFIX = "kube-api-access-"


def without_job_label(pod: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(pod))
    del out["metadata"]["labels"][JOB_NAME_KEY]
    return out


def with_job_label(pod: Mapping[str, Any], job_name: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(pod))
    out["metadata"]["labels"][JOB_NAME_KEY] = job_name
    return out


def comparable(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The Pod without what differs between two creations of the same Pod: server-set metadata, and
    the random suffix of the ServiceAccount plugin's token volume."""
    out = copy.deepcopy(dict(pod))
    for key in SERVER_SET:
        out["metadata"].pop(key, None)
    spec = out["spec"]
    for volume in spec.get("volumes") or []:
        if volume["name"].startswith(TOKEN_VOLUME_PREFIX):
            volume["name"] = TOKEN_VOLUME_PREFIX
    for container in (*spec.get("initContainers", ()), *spec["containers"]):
        for mount in container.get("volumeMounts") or []:
            if mount["name"].startswith(TOKEN_VOLUME_PREFIX):
                mount["name"] = TOKEN_VOLUME_PREFIX
    return out


def wiring(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the plugins write, to show first when two Pods differ."""
    spec = pod["spec"]
    return {
        "hostname": spec.get("hostname"),
        "subdomain": spec.get("subdomain"),
        "volumes": spec.get("volumes"),
        "containers": {
            c["name"]: {"env": c.get("env"), "volumeMounts": c.get("volumeMounts"), "ports": c.get("ports")}
            for c in (*spec.get("initContainers", ()), *spec["containers"])
        },
    }


@dataclass
class Expected:
    before: dict[str, Any]  # the Pod as the API server would store it without the webhook
    after: dict[str, Any]  # the offline chain's wiring of ``before``, as the API server would store it
    warnings: list[str]  # the offline chain's warnings


def expected_pod(api: kube_client.ApiClient, job: Job, pod: Mapping[str, Any]) -> Expected:
    """What the offline chain makes of ``pod``, through the API server without the webhook (dry runs)."""
    before = with_job_label(create(api, without_job_label(pod), dry_run=True), job.name)
    mutation = Chain().mutate(job, before)
    after = with_job_label(create(api, without_job_label(mutation.pod), dry_run=True), job.name)
    return Expected(before, after, mutation.warnings)


def replica_indexes(replicas: int) -> list[int]:
    return sorted({0, replicas - 1}) if replicas > 0 else []


# Tests -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLE_JOBS, ids=lambda p: p.stem)
def test_pods_are_wired_as_the_chain_wires_them_offline(
    path: Path, registered: Registered, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    job_warnings: list[str] = []
    stored = create(kube_admin, example_job(path.name.removesuffix("-job.yaml"), kube_namespace), warnings=job_warnings)  # /validate let it in
    job = Job.from_object(stored)
    assert job_warnings == Chain().check(job)
    pods = 0
    for task in job.tasks:
        for index in replica_indexes(task.replicas):
            pod = make_pod(job, task.name, index)
            expected = expected_pod(kube_admin, job, pod)
            where = f"{job.key} {task.name}-{index}"
            assert comparable(expected.after) != comparable(expected.before), f"{where}: the chain changed nothing"
            warnings: list[str] = []
            created = create(kube_admin, pod, warnings=warnings)
            actual = read(kube_admin, "v1", "Pod", created["metadata"]["name"], kube_namespace)
            assert actual is not None
            assert wiring(comparable(actual)) == wiring(comparable(expected.after)), where
            assert comparable(actual) == comparable(expected.after), where
            assert warnings == expected.warnings, where
            pods += 1
    assert pods >= 2


def test_the_chains_warnings_reach_whoever_creates_the_job_and_its_pods(
    registered: Registered, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    """5000 workers make VC_WORKER_HOSTS too long for one environment string: the Job is admitted
    and its Pods are wired without it, each with the chain's warning, as kubectl would print it."""
    obj = example_job("svc", kube_namespace)
    obj["spec"]["tasks"][1]["replicas"] = 5000
    job_warnings: list[str] = []
    job = Job.from_object(create(kube_admin, obj, warnings=job_warnings))
    assert job_warnings == Chain().check(job) != []
    pod = make_pod(job, "worker", 4999)
    expected = expected_pod(kube_admin, job, pod)
    pod_warnings: list[str] = []
    created = create(kube_admin, pod, warnings=pod_warnings)
    assert comparable(created) == comparable(expected.after)
    assert pod_warnings == expected.warnings != []


def test_pod_of_a_job_with_a_bad_argument_is_denied(registered: Registered, kube_admin: kube_client.ApiClient) -> None:
    job = Job.from_object(registered.stale_job)
    pod = make_pod(job, "master", 0)
    with pytest.raises(ApiException) as info:
        create(kube_admin, pod)
    assert info.value.status == 403
    assert status_message(info.value) == denied(MUTATING_HOOK, offline_error(job, pod))
    assert BAD_PORT.partition("=")[2] in status_message(info.value)
    assert read(kube_admin, "v1", "Pod", pod["metadata"]["name"], job.namespace) is None


def test_job_with_a_bad_argument_is_denied_at_validate(
    registered: Registered, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    obj = bad_job(kube_namespace, "bad")
    with pytest.raises(ApiException) as info:
        create(kube_admin, obj)
    assert info.value.status == 403
    assert status_message(info.value) == denied(VALIDATING_HOOK, offline_error(Job.from_object(obj)))
    assert read(kube_admin, JOB_API_VERSION, "Job", "bad", kube_namespace) is None


def test_update_to_a_bad_argument_is_denied_and_the_job_kept(
    registered: Registered, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    stored = create(kube_admin, example_job("pytorch", kube_namespace))
    changed = copy.deepcopy(stored)
    changed["spec"]["plugins"]["pytorch"] = ["--master=master", "--worker=worker", BAD_PORT]
    with pytest.raises(ApiException) as info:
        replace(kube_admin, changed)
    assert info.value.status == 403
    assert status_message(info.value) == denied(VALIDATING_HOOK, offline_error(Job.from_object(changed)))
    now = read(kube_admin, JOB_API_VERSION, "Job", stored["metadata"]["name"], kube_namespace)
    assert now is not None and now["spec"]["plugins"] == stored["spec"]["plugins"]


def test_pod_of_a_job_that_does_not_exist_is_let_through_unwired(
    registered: Registered, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    """A cache miss goes to the API server (a live GET, under the webhook's RBAC); a 404 lets the
    Pod through exactly as it came, rather than blocking it, and the creator is told why."""
    obj = example_job("env", kube_namespace)
    obj["metadata"]["uid"] = "00000000-0000-4000-8000-00000000dead"
    job = Job.from_object(obj)
    pod = make_pod(job, "worker", 0)
    before = expected_pod(kube_admin, job, pod).before
    warnings: list[str] = []
    created = create(kube_admin, pod, warnings=warnings)
    assert comparable(created) == comparable(before)
    assert warnings == [f"volcano-job-webhook: job {job.key} not found: Pod not wired by its plugins"]


def test_the_webhook_makes_only_granted_calls_and_none_is_refused(
    registered: Registered, envtest: EnvTest, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    """By the API server's audit log: the webhook lists and watches Jobs cluster-wide and, on a
    cache miss, GETs one; each call is within what manifests/ grant its ServiceAccount, and the API
    server refused none of its requests. (Nothing else in this module acts as its user, and the
    session runs one test at a time, so its user's requests since it started are its own.)"""
    job = Job.from_object(example_job("env", kube_namespace) | {"metadata": {
        "name": "never-created", "namespace": kube_namespace, "uid": "00000000-0000-4000-8000-00000000beef"}})
    create(kube_admin, make_pod(job, "worker", 0))  # a miss: the webhook asks the API server

    def calls() -> list[AuditEvent]:
        events = envtest.audit_events(WEBHOOK_USER, since=registered.webhook.started)
        return events if any(e.verb == "get" and e.namespace == kube_namespace for e in events) else []

    made = wait_until(calls, 10, "the webhook's GET in the audit log")
    assert {e.permission for e in made} == {("batch.volcano.sh", "jobs", verb) for verb in ("list", "watch", "get")}
    assert {e.permission for e in made} <= rbac_permissions()
    assert [e for e in made if e.code in (401, 403)] == []


def test_a_cached_job_is_answered_from_the_cache_and_a_finished_one_is_asked_for(
    registered: Registered, envtest: EnvTest, kube_admin: kube_client.ApiClient, kube_namespace: str
) -> None:
    """The webhook holds a live Job as a packed record and wires its Pods without asking the API
    server; a finished Job it holds as its identity only, so the rare late Pod of one costs a GET."""
    stored = create(kube_admin, example_job("env", kube_namespace))
    job = Job.from_object(stored)
    time.sleep(1.0)  # the watch event reaches the webhook's cache
    since = datetime.now(UTC)
    wired = create(kube_admin, make_pod(job, "worker", 0))
    assert any(e["name"] == "VK_TASK_INDEX" for e in wired["spec"]["containers"][0].get("env") or [])
    time.sleep(0.5)
    gets = [e for e in envtest.audit_events(WEBHOOK_USER, since=since) if e.verb == "get" and e.namespace == kube_namespace]
    assert gets == [], "answered from the cache"
    request(kube_admin, "PATCH", f"/apis/{JOB_API_VERSION}/namespaces/{kube_namespace}/jobs/{job.name}/status",
            body={"status": {"state": {"phase": "Completed"}}}, content_type="application/merge-patch+json")
    time.sleep(1.0)
    since = datetime.now(UTC)
    late = create(kube_admin, make_pod(job, "worker", 1))
    assert any(e["name"] == "VK_TASK_INDEX" for e in late["spec"]["containers"][0].get("env") or [])

    def asked() -> list[AuditEvent]:
        return [e for e in envtest.audit_events(WEBHOOK_USER, since=since)
                if e.verb == "get" and e.namespace == kube_namespace and e.name == job.name]
    wait_until(asked, 10, "the webhook's GET of the finished Job in the audit log")
