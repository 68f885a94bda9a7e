"""Volcano's job controller as the scenarios see it (tests/cluster.py): the emulation
(tests/volcano_controller.py on the API-server double) on every machine, and the same tests against
the real ``vc-controller-manager`` where it exists, so a difference between the two fails here.

The Job is real-kubernetes.md's: ``minAvailable: 3``, master×1 and worker×2, ``plugins: {svc: [],
ssh: [], env: []}``. What is asserted is what that document records of the real controller; the
emulator's own counters and write log are checked only on the emulation. Why the API double: the
emulation runs on it, so that a machine without the real parts still covers Volcano's controller
beside the product; the two tests of the retry limit run on the emulation alone (Volcano's own 15
retries back off to about 160 s)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import VolcanoCluster, names
from tests.envtest import apply, create
from tests.jobs import job_owner, scheduled_job
from tests.servers import TinyWebhook, denying, tiny_webhook
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL

JOB = "vj"
PLUGIN_OBJECTS = (("Secret", f"{JOB}-ssh"), ("ConfigMap", f"{JOB}-svc"), ("Service", JOB), ("NetworkPolicy", JOB))
PODS = [f"{JOB}-master-0", f"{JOB}-worker-0", f"{JOB}-worker-1"]


PLUGINS = {"svc": [], "ssh": [], "env": []}


def plugin_objects(c: VolcanoCluster) -> dict[tuple[str, str], dict[str, Any] | None]:
    return {(kind, name): c.get(kind, name) for kind, name in PLUGIN_OBJECTS}


def status(c: VolcanoCluster, job: str = JOB) -> dict[str, Any]:
    stored = c.get("Job", job) or {}
    found: dict[str, Any] = stored.get("status") or {}
    return found


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def started(c: VolcanoCluster) -> list[dict[str, Any]]:
    """Create the Job, wait for its plugin objects, enqueue its PodGroup, wait for its three Pods."""
    c.create(scheduled_job(JOB, plugins=PLUGINS))
    c.wait(lambda: all(plugin_objects(c).values()), "Volcano's four plugin objects")
    c.inqueue(JOB)
    return c.wait(lambda: names(pods := c.pods(JOB)) == PODS and pods, "the three Pods")


def test_a_new_job_gets_volcanos_objects_and_podgroup_before_any_pod(cluster: VolcanoCluster) -> None:
    job = cluster.create(scheduled_job(JOB, plugins=PLUGINS))
    objects = cluster.wait(lambda: all((found := plugin_objects(cluster)).values()) and found, "Volcano's four plugin objects")
    podgroup = cluster.wait(lambda: cluster.podgroup(JOB), "the PodGroup")
    assert podgroup["metadata"]["name"] == f"{JOB}-{job['metadata']['uid']}"
    assert (podgroup.get("status") or {}).get("phase", "") == ""
    assert podgroup["metadata"]["ownerReferences"] == [job_owner(job)]
    for (kind, name), obj in objects.items():
        assert obj is not None
        assert obj["metadata"]["ownerReferences"] == [job_owner(job)], (kind, name)
        assert not obj["metadata"].get("labels"), f"{kind} {name} carries labels: Volcano puts none"
    secret = objects[("Secret", f"{JOB}-ssh")]
    assert secret is not None and sorted(secret["data"]) == ["authorized_keys", "config", "id_rsa", "id_rsa.pub"]
    config_map = objects[("ConfigMap", f"{JOB}-svc")]
    assert config_map is not None and config_map["data"]["VC_WORKER_HOSTS"] == f"{JOB}-worker-0.{JOB},{JOB}-worker-1.{JOB}"
    assert config_map["data"]["VC_MASTER_NUM"] == "1" and config_map["data"]["master.host"] == f"{JOB}-master-0.{JOB}"
    service = objects[("Service", JOB)]
    assert service is not None and service["spec"]["clusterIP"] == "None"
    cluster.settle()
    assert cluster.pods(JOB) == [], "no Pod before the PodGroup is Inqueue"
    assert cluster.phase(JOB) == "Pending"
    assert not status(cluster).get("controlledResources"), "recorded with the first Pod counts, not before"
    if cluster.emulator is not None:
        counters = cluster.emulator.counters
        assert {k: counters.created[k] for k in ("Secret", "ConfigMap", "Service", "NetworkPolicy", "PodGroup", "Pod")} == {
            "Secret": 1, "ConfigMap": 1, "Service": 1, "NetworkPolicy": 1, "PodGroup": 1, "Pod": 0}
        assert counters.key_pairs == 1


def test_an_enqueued_job_gets_pods_wired_by_volcanos_plugins(cluster: VolcanoCluster) -> None:
    pods = started(cluster)
    job = cluster.get("Job", JOB)
    assert job is not None
    for pod in pods:
        name = pod["metadata"]["name"]
        index = name.rsplit("-", 1)[1]
        spec, annotations = pod["spec"], pod["metadata"]["annotations"]
        assert (spec["hostname"], spec["subdomain"]) == (name, JOB)
        env = env_of(pod)
        assert env["VC_TASK_INDEX"] == env["VK_TASK_INDEX"] == index
        assert env["VC_WORKER_NUM"] == {"configMapKeyRef": {"name": f"{JOB}-svc", "key": "VC_WORKER_NUM"}}
        (container,) = spec["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/etc/volcano"] == f"{JOB}-svc" and mounts["/root/.ssh"] == f"{JOB}-ssh"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes[f"{JOB}-svc"]["configMap"]["name"] == f"{JOB}-svc"
        assert volumes[f"{JOB}-ssh"]["secret"]["secretName"] == f"{JOB}-ssh"
        assert annotations["scheduling.k8s.io/group-name"] == f"{JOB}-{job['metadata']['uid']}"
        assert (annotations["volcano.sh/job-version"], annotations["volcano.sh/job-retry-count"]) == ("0", "0")
        assert pod["metadata"]["ownerReferences"] == [job_owner(job)]
        assert pod["status"]["phase"] == "Pending"
    recorded = cluster.wait(lambda: status(cluster).get("controlledResources"), "controlledResources")
    assert recorded == {"plugin-env": "env", "plugin-ssh": "ssh", "plugin-svc": "svc"}
    assert status(cluster)["pending"] == 3 and cluster.phase(JOB) == "Pending"
    if cluster.emulator is not None:
        writes = [(w.verb, w.kind) for w in cluster.emulator.writes if w.verb == "create" and w.kind != "Event"]
        first_pod = writes.index(("create", "Pod"))
        assert {kind for _, kind in writes[:first_pod]} == {"Secret", "ConfigMap", "Service", "NetworkPolicy", "PodGroup"}


def test_pods_that_start_then_succeed_complete_the_job_and_remove_its_objects(cluster: VolcanoCluster) -> None:
    pods = started(cluster)
    cluster.set_pod_phase(pods[0]["metadata"]["name"], "Running")
    cluster.wait(lambda: (found := status(cluster)).get("running") == 1 and found.get("pending") == 2, "one Pod counted running")
    assert cluster.phase(JOB) == "Pending", "under minAvailable: still Pending"
    for pod in pods[1:]:
        cluster.set_pod_phase(pod["metadata"]["name"], "Running")
    cluster.wait(lambda: cluster.phase(JOB) == "Running" and status(cluster).get("running") == 3, "the Job to run")
    cluster.finish(JOB)
    cluster.wait(lambda: cluster.phase(JOB) == "Completed", "the Job to complete")
    cluster.wait(lambda: not any(plugin_objects(cluster).values()) and cluster.podgroup(JOB) is None,
                 "the plugin objects and the PodGroup to be deleted")
    kept = cluster.pods(JOB)
    assert names(kept) == PODS and {p["status"]["phase"] for p in kept} == {"Succeeded"}
    assert [c["status"] for c in status(cluster)["conditions"]] == ["Pending", "Running", "Completed"]
    if cluster.emulator is not None:
        # Pending, the Pods counted, one running, Running, Completed, the kill that removes the objects
        updates = [w for w in cluster.emulator.writes if (w.verb, w.kind) == ("update", "Job")]
        assert len(updates) >= 6 and cluster.emulator.counters.status_writes == len(updates)


def test_pods_that_succeed_at_once_take_the_job_through_running(cluster: VolcanoCluster) -> None:
    started(cluster)
    cluster.finish(JOB)
    cluster.wait(lambda: cluster.phase(JOB) == "Completed", "the Job to complete")
    assert [c["status"] for c in status(cluster)["conditions"]] == ["Pending", "Running", "Completed"]


def test_a_restart_deletes_everything_and_remakes_it_with_a_new_key(cluster: VolcanoCluster) -> None:
    started(cluster)
    old_key = (cluster.get("Secret", f"{JOB}-ssh") or {})["data"]["id_rsa"]
    old_podgroup = cluster.podgroup(JOB)
    assert old_podgroup is not None
    # Whoever made an object, Volcano deletes it by name: here it carries this project's label.
    apply(cluster.admin, {"apiVersion": "v1", "kind": "Service",
                          "metadata": {"name": JOB, "namespace": cluster.namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}})
    cluster.restart(JOB)
    cluster.wait(lambda: cluster.phase(JOB) == "Restarting", "the Job to restart")
    cluster.wait(lambda: cluster.pods(JOB) == [] and cluster.list("Command") == [], "the Pods and the Command to go")
    after = status(cluster)
    assert (after.get("retryCount"), after.get("version")) == (1, 1)
    new_podgroup = cluster.wait(lambda: (pg := cluster.podgroup(JOB)) and pg["metadata"]["uid"] != old_podgroup["metadata"]["uid"] and pg,
                                "the PodGroup made again")
    assert (new_podgroup.get("status") or {}).get("phase", "") == ""
    cluster.wait(lambda: cluster.get("ConfigMap", f"{JOB}-svc"), "the ConfigMap back at once")
    cluster.settle()
    assert {k: v is not None for k, v in plugin_objects(cluster).items()} == {
        ("Secret", f"{JOB}-ssh"): False, ("ConfigMap", f"{JOB}-svc"): True, ("Service", JOB): False, ("NetworkPolicy", JOB): False}
    cluster.inqueue(JOB)
    pods = cluster.wait(lambda: names(found := cluster.pods(JOB)) == PODS and found, "the Pods again")
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert (annotations["volcano.sh/job-version"], annotations["volcano.sh/job-retry-count"]) == ("1", "1")
    cluster.wait(lambda: all(plugin_objects(cluster).values()), "a new Secret, the Service and the NetworkPolicy")
    new_key = (cluster.get("Secret", f"{JOB}-ssh") or {})["data"]["id_rsa"]
    assert base64.b64decode(new_key) != base64.b64decode(old_key)
    cluster.wait(lambda: cluster.phase(JOB) == "Pending", "the Job Pending again")
    cluster.settle()
    assert not status(cluster).get("controlledResources"), "after a restart Volcano leaves it empty until Pod counts change"
    if cluster.emulator is not None:
        assert cluster.emulator.counters.key_pairs == 2
        creates = [(w.kind, w.name) for w in cluster.emulator.writes if w.verb == "create"]
        second_secret = [i for i, w in enumerate(creates) if w == ("Secret", f"{JOB}-ssh")][1]
        last_pod = max(i for i, (kind, _) in enumerate(creates) if kind == "Pod")
        assert last_pod < second_secret, "the Pods come before the new Secret"


def test_a_failed_pod_under_a_restart_policy_restarts_the_job(cluster: VolcanoCluster) -> None:
    cluster.create(scheduled_job("pj", plugins=PLUGINS, policies=[{"event": "PodFailed", "action": "RestartJob"}]))
    cluster.inqueue("pj")
    pods = cluster.wait(lambda: len(found := cluster.pods("pj")) == 3 and found, "the Pods")
    cluster.set_pod_phase(pods[1]["metadata"]["name"], "Failed")
    cluster.wait(lambda: status(cluster, "pj").get("retryCount") == 1, "the restart")
    cluster.wait(lambda: cluster.pods("pj") == [], "the Pods to go")


@pytest.fixture(scope="module")
def denier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyWebhook]:
    with tiny_webhook(tmp_path_factory.mktemp("denier")) as hook:
        hook.answers["/deny"] = denying("no Pods today", code=403)
        yield hook


def test_a_pod_webhook_that_denies_ends_the_job_after_the_retry_limit(emulated_volcano_cluster: VolcanoCluster,
                                                                       denier: TinyWebhook) -> None:
    # Emulated only: Volcano's own 15 retries back off from 5 ms doubling, about 160 s in all.
    cluster = emulated_volcano_cluster
    selector = {"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]}
    create(cluster.admin, {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                           "metadata": {"name": "denier"},
                           "webhooks": [denier.hook("pods.denier.test", "/deny", objectSelector=selector, failurePolicy="Fail")]})
    cluster.create(scheduled_job(JOB, plugins=PLUGINS))
    cluster.wait(lambda: all(plugin_objects(cluster).values()), "Volcano's four plugin objects")
    cluster.inqueue(JOB)
    cluster.wait(lambda: cluster.phase(JOB) == "Terminated", "the Job to be terminated")
    cluster.wait(lambda: not any(plugin_objects(cluster).values()) and cluster.podgroup(JOB) is None,
                 "the plugin objects and the PodGroup to be deleted")
    assert cluster.pods(JOB) == []
    emulator = cluster.emulator
    assert emulator is not None
    counters = emulator.counters
    assert counters.sync_failures == 1 + emulator.max_requeue == 16
    assert counters.pod_create_failures == 16 * 3
    assert len([c for c in (cluster.api.webhook_calls if cluster.api else []) if c.webhook == "pods.denier.test"]) == 48
    reasons = [(e["reason"], e["message"]) for e in cluster.events(JOB)]
    assert ("ExecuteAction", "Job failed on action SyncJob for retry limit reached") in reasons
    failed_create = [m for r, m in reasons if r == "FailedCreate"]
    assert len(failed_create) == 16
    assert 'admission webhook "pods.denier.test" denied the request: no Pods today' in failed_create[0]
    assert [c["status"] for c in status(cluster)["conditions"]][-2:] == ["Terminating", "Terminated"]


def test_a_job_naming_a_plugin_volcano_lacks_gives_up_after_the_retry_limit(emulated_volcano_cluster: VolcanoCluster) -> None:
    # Volcano's TerminateJob runs the plugins' OnJobDelete, which fails the same way: the Job stays
    # Pending, dropped from the queue.
    cluster = emulated_volcano_cluster
    cluster.create(scheduled_job(JOB, plugins={"torchrun": []}))
    limit = ("ExecuteAction", "Job failed on action SyncJob for retry limit reached")
    reasons = cluster.wait(lambda: limit in (found := [(e["reason"], e["message"]) for e in cluster.events(JOB)]) and found,
                           "the retry limit")
    assert reasons.count(("PluginError", "Execute plugin when job add failed, err: failed to get plugin torchrun")) == 16
    emulator = cluster.emulator
    assert emulator is not None
    cluster.settle()
    assert emulator.counters.sync_failures == 16
    assert cluster.phase(JOB) == "Pending" and cluster.podgroup(JOB) is None

