"""The product beside Volcano's own job controller, as a cluster operator runs it: the webhook
(``serve --job-source kube``) registered with the manifests' configurations, the reconciler
(``reconcile``, resync every second) running, both as the product's user under the manifests'
RBAC, and Volcano's controller making its plugin objects and the Pods (tests/helpers/cluster.py: the real
``vc-controller-manager`` and kube-apiserver).

Every object has exactly one maker; Volcano's objects get nothing from us (no write, no 409, no key,
no Warning Event) over several resyncs and status updates; every Pod is wired once; a restart and
a completion leave Volcano's objects to Volcano; a running job with a flag Volcano ignores keeps
getting Pods and can be labelled; a Job made again under the same name gets new objects and a new
key; a webhook cut off from the API server refuses a Pod with an error and wires it once it is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import (
    ProductReconciler,
    ProductWebhook,
    VolcanoCluster,
    kind_path,
    metrics,
    names,
    product_reconciler,
    product_webhook,
    server_address,
    through,
    total,
)
from tests.helpers.envtest import request
from tests.helpers.jobs import scheduled_job
from tests.helpers.servers import TcpProxy
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL

KINDS = ("ConfigMap", "Service", "NetworkPolicy", "Secret")
COMPONENT = "volcano-job-webhook-reconciler"


def objects(c: VolcanoCluster, *, ours: bool) -> dict[tuple[str, str], dict[str, Any]]:
    """The side-object kinds in the namespace, ours (by label) or everybody else's."""
    return {(kind, o["metadata"]["name"]): o for kind in KINDS for o in c.list(kind)
            if ((o["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY) == ours
            and not o["metadata"]["name"].startswith("default-token")}


def our_warnings(c: VolcanoCluster) -> list[str]:
    return [f"{e['reason']}: {e['message']}" for e in c.list("Event")
            if (e.get("source") or {}).get("component") == COMPONENT or e.get("reportingComponent") == COMPONENT]


def controllers(obj: dict[str, Any]) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]


def env_names(pod: dict[str, Any]) -> list[str]:
    return [e["name"] for container in pod["spec"]["containers"] for e in container.get("env") or []]


def assert_wired_once(pod: dict[str, Any]) -> None:
    """No variable, volume, mount or port twice: what a Pod wired by two makers would show."""
    spec = pod["spec"]
    volumes = [v["name"] for v in spec.get("volumes") or []]
    assert len(volumes) == len(set(volumes)), volumes
    for container in spec["containers"]:
        for field, key in (("env", "name"), ("volumeMounts", "mountPath"), ("ports", "containerPort")):
            values = [item[key] for item in container.get(field) or []]
            assert len(values) == len(set(values)), (pod["metadata"]["name"], field, values)


def no_patches_from_us(webhook: ProductWebhook) -> None:
    patched = total(webhook.base_url, "volcano_webhook_patches_total")
    assert patched == 0, f"the webhook patched {patched} Pods Volcano had wired"


def refused(webhook: ProductWebhook) -> float:
    """The Pods the webhook has refused (denied, or an error answered), from its /metrics."""
    samples = metrics(webhook.base_url)  # one scrape a poll
    return sum(samples.get(f'volcano_webhook_admission_requests_total{{endpoint="mutate",result="{result}"}}', 0.0)
               for result in ("denied", "error", "bad-request"))


@pytest.fixture
def product(cluster: VolcanoCluster, tmp_path: Path) -> Iterator[tuple[ProductWebhook, ProductReconciler]]:
    with ExitStack() as stack:
        (tmp_path / "serve").mkdir()
        (tmp_path / "reconcile").mkdir()
        webhook = stack.enter_context(product_webhook(cluster, tmp_path / "serve"))
        reconciler = stack.enter_context(product_reconciler(
            cluster.kubeconfig(tmp_path), cluster.namespace, tmp_path / "reconcile", "--resync-seconds=1"))
        cluster.register_webhooks(webhook.base_url, webhook.ca_bundle)
        yield webhook, reconciler


def run_pods(c: VolcanoCluster, name: str) -> list[dict[str, Any]]:
    """Enqueue the Job's PodGroup, wait for its three Pods, and move them to Running one by one:
    each a status change of the Job, as while a real job starts."""
    c.inqueue(name)
    pods = c.wait(lambda: len(found := c.pods(name)) == 3 and found, f"the Pods of {name}")
    for pod in pods:
        c.set_pod_phase(pod["metadata"]["name"], "Running")
    return pods


def through_resyncs(c: VolcanoCluster, seconds: float = 3.5) -> None:
    time.sleep(seconds)
    c.settle()


def test_spec_plugins_only_volcano_makes_everything_and_we_touch_nothing(cluster, product):
    webhook, reconciler = product
    made = cluster.create(scheduled_job("vj", plugins={"svc": [], "ssh": [], "env": []}))
    cluster.wait(lambda: len(objects(cluster, ours=False)) == 4, "Volcano's four objects")
    pods = run_pods(cluster, "vj")
    through_resyncs(cluster)
    volcanos = objects(cluster, ours=False)
    assert set(volcanos) == {("Secret", "vj-ssh"), ("ConfigMap", "vj-svc"), ("Service", "vj"), ("NetworkPolicy", "vj")}
    assert all(controllers(o) == [made["metadata"]["uid"]] for o in volcanos.values())
    assert objects(cluster, ours=True) == {}
    assert reconciler.total("volcano_reconciler_writes_total") == 0
    assert reconciler.total('volcano_reconciler_api_errors_total{status="409"}') == 0
    assert our_warnings(cluster) == []
    for pod in cluster.pods("vj"):
        assert_wired_once(pod)
        assert env_names(pod).count("VC_TASK_INDEX") == 1
    no_patches_from_us(webhook)
    assert names(pods) == names(cluster.pods("vj"))


def test_annotation_plugins_only_we_make_everything_and_wire_the_pods(cluster, product):
    _, reconciler = product
    made = cluster.create(scheduled_job("aj", annotation={"env": [], "hostfile": []}))
    cluster.wait(lambda: ("ConfigMap", "aj-hostfile") in objects(cluster, ours=True), "our host file")
    run_pods(cluster, "aj")
    through_resyncs(cluster)
    ours = objects(cluster, ours=True)
    assert set(ours) == {("ConfigMap", "aj-hostfile"), ("ConfigMap", "aj-svc"), ("Service", "aj"), ("NetworkPolicy", "aj")}
    assert all(controllers(o) == [made["metadata"]["uid"]] for o in ours.values())
    assert objects(cluster, ours=False) == {}, "Volcano makes nothing for plugins it is not told of"
    for pod in cluster.pods("aj"):
        assert_wired_once(pod)
        names_ = env_names(pod)
        assert {"VC_TASK_INDEX", "VC_MASTER_HOSTS", "VC_WORKER_HOSTS"} <= set(names_)
        assert "/etc/mpi/hostfile" in [m["mountPath"] for m in pod["spec"]["containers"][0].get("volumeMounts") or []]
    writes = reconciler.total("volcano_reconciler_writes_total")
    assert writes == 4, f"four creates and nothing after, over several resyncs: {reconciler.metrics()}"
    assert our_warnings(cluster) == []


def test_both_an_annotation_plugin_that_brings_in_svc_while_spec_plugins_names_svc(cluster, product):
    _, reconciler = product
    made = cluster.create(scheduled_job("bj", plugins={"svc": [], "env": []}, annotation={"torchrun": []}))
    cluster.wait(lambda: len(objects(cluster, ours=False)) == 3, "Volcano's svc objects")
    run_pods(cluster, "bj")
    through_resyncs(cluster)
    assert set(objects(cluster, ours=False)) == {("ConfigMap", "bj-svc"), ("Service", "bj"), ("NetworkPolicy", "bj")}
    assert objects(cluster, ours=True) == {}, "svc is Volcano's here; torchrun makes no object"
    assert all(controllers(o) == [made["metadata"]["uid"]] for o in objects(cluster, ours=False).values())
    assert reconciler.total("volcano_reconciler_writes_total") == 0
    assert our_warnings(cluster) == []
    for pod in cluster.pods("bj"):
        assert_wired_once(pod)
        names_ = env_names(pod)
        assert "PET_NNODES" in names_ and "VC_TASK_INDEX" in names_ and "VC_MASTER_HOSTS" in names_


def test_a_restart_and_a_completion_leave_volcanos_objects_to_volcano(cluster, product):
    _, reconciler = product
    cluster.create(scheduled_job("rj", plugins={"svc": [], "ssh": []}, annotation={"hostfile": []}))
    cluster.wait(lambda: len(objects(cluster, ours=False)) == 4 and objects(cluster, ours=True), "both makers' objects")
    run_pods(cluster, "rj")
    ours_before = objects(cluster, ours=True)
    key_before = objects(cluster, ours=False)[("Secret", "rj-ssh")]["data"]["id_rsa"]
    podgroup = cluster.podgroup("rj")
    assert podgroup is not None
    cluster.restart("rj")
    # Volcano deletes its objects by name, and makes them again (a new key) once Pods come back.
    cluster.wait(lambda: ("Secret", "rj-ssh") not in objects(cluster, ours=False), "Volcano's Secret deleted on restart")
    cluster.wait(lambda: (pg := cluster.podgroup("rj")) and pg["metadata"]["uid"] != podgroup["metadata"]["uid"], "the new PodGroup")
    run_pods(cluster, "rj")
    cluster.wait(lambda: ("Secret", "rj-ssh") in objects(cluster, ours=False), "Volcano's new Secret")
    assert objects(cluster, ours=False)[("Secret", "rj-ssh")]["data"]["id_rsa"] != key_before
    ours_after = objects(cluster, ours=True)
    assert {k: v["metadata"]["uid"] for k, v in ours_after.items()} == {k: v["metadata"]["uid"] for k, v in ours_before.items()}, \
        "ours stay through a restart"
    assert all(k[0] != "Secret" for k in ours_after), "we made no Secret of Volcano's"
    # Completion: Volcano deletes its own; ours go too (a finished job starts no Pod again), and
    # nothing is made again afterwards.
    cluster.finish("rj")
    cluster.wait(lambda: cluster.phase("rj") == "Completed", "the Job Completed")
    cluster.wait(lambda: not objects(cluster, ours=False) and not objects(cluster, ours=True), "every side object gone")
    through_resyncs(cluster)
    assert objects(cluster, ours=False) == {} and objects(cluster, ours=True) == {}
    assert reconciler.total('volcano_reconciler_writes_total{action="create"') == 1, "only our host file, once"
    assert reconciler.total('volcano_reconciler_api_errors_total{status="409"}') == 0
    assert our_warnings(cluster) == []


def test_a_running_job_with_a_flag_volcano_ignores_keeps_getting_pods_and_can_be_labelled(cluster, tmp_path):
    # The job was admitted before the webhook was installed (Volcano's admission does not judge flags).
    cluster.create(scheduled_job("fj", plugins={"svc": ["--no-such-flag"], "env": []}))
    cluster.wait(lambda: len(objects(cluster, ours=False)) == 3, "Volcano's objects")
    with product_webhook(cluster, tmp_path) as webhook:
        cluster.register_webhooks(webhook.base_url, webhook.ca_bundle)
        run_pods(cluster, "fj")
        assert cluster.phase("fj") not in ("Terminated", "Failed")
        labelled = request(cluster.admin, "PATCH", kind_path(cluster.admin, "Job", cluster.namespace, "fj"),
                           body={"metadata": {"labels": {"team": "vision"}}}, content_type="application/merge-patch+json")
        assert labelled["metadata"]["labels"] == {"team": "vision"}
        assert total(webhook.base_url, 'volcano_webhook_admission_requests_total{endpoint="mutate"') >= 3
        assert refused(webhook) == 0


def test_a_job_made_again_under_the_same_name_gets_new_objects_and_a_new_key(cluster, product):
    _, reconciler = product
    first = cluster.create(scheduled_job("nj", annotation={"mpi": []}))
    cluster.wait(lambda: ("Secret", "nj-ssh") in objects(cluster, ours=True), "our Secret")
    key = objects(cluster, ours=True)[("Secret", "nj-ssh")]["data"]["id_rsa"]
    request(cluster.admin, "DELETE", kind_path(cluster.admin, "Job", cluster.namespace, "nj"))
    cluster.wait(lambda: cluster.get("Job", "nj") is None, "the Job gone")
    second = cluster.create(scheduled_job("nj", annotation={"mpi": []}))
    uid = second["metadata"]["uid"]
    assert uid != first["metadata"]["uid"]

    def renewed() -> bool:
        found = objects(cluster, ours=True)
        return bool(found) and all(controllers(o) == [uid] for o in found.values()) and ("Secret", "nj-ssh") in found
    cluster.wait(renewed, "the new Job's objects, each with one controller: the new Job")
    assert objects(cluster, ours=True)[("Secret", "nj-ssh")]["data"]["id_rsa"] != key
    assert reconciler.total('volcano_reconciler_api_errors_total{status="422"}') == 0


def test_a_webhook_cut_off_from_the_api_server_refuses_the_pod_then_wires_it(cluster, tmp_path):
    workdir = tmp_path / "serve"
    workdir.mkdir()
    kubeconfig = cluster.kubeconfig(tmp_path)
    proxy = TcpProxy(server_address(kubeconfig))
    try:
        with product_webhook(cluster, workdir, kubeconfig=through(kubeconfig, proxy.port, tmp_path)) as webhook:
            cluster.register_webhooks(webhook.base_url, webhook.ca_bundle)
            proxy.cut()
            # A Job the cut-off webhook has not seen: its Pods need a lookup, which fails.
            cluster.create(scheduled_job("cj", annotation={"env": []}))
            cluster.inqueue("cj")
            cluster.wait(lambda: refused(webhook), "a Pod refused while the webhook cannot look its Job up")
            assert cluster.pods("cj") == [], "no Pod let through unwired"
            proxy.mend()
            pods = cluster.wait(lambda: len(found := cluster.pods("cj")) == 3 and found, "the Pods, once the API server is back")
            for pod in pods:
                assert env_names(pod).count("VC_TASK_INDEX") == 1, "wired by us (env is the annotation's)"
    finally:
        proxy.close()


