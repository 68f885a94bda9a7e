"""Volcano's job controller as the scenarios beside it see it (tests/helpers/cluster.py): what
real-kubernetes.md records of ``vc-controller-manager``, which the scenarios and the reconciler's
ownership rules build on (its objects, their order, what a restart remakes).

The Job is real-kubernetes.md's: ``minAvailable: 3``, master×1 and worker×2, ``plugins: {svc: [],
ssh: [], env: []}``."""

from __future__ import annotations

import base64
from typing import Any

from tests.helpers.cluster import VolcanoCluster, names
from tests.helpers.envtest import apply
from tests.helpers.jobs import job_owner, scheduled_job
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


def test_a_failed_pod_under_a_restart_policy_restarts_the_job(cluster: VolcanoCluster) -> None:
    cluster.create(scheduled_job("pj", plugins=PLUGINS, policies=[{"event": "PodFailed", "action": "RestartJob"}]))
    cluster.inqueue("pj")
    pods = cluster.wait(lambda: len(found := cluster.pods("pj")) == 3 and found, "the Pods")
    cluster.set_pod_phase(pods[1]["metadata"]["name"], "Failed")
    cluster.wait(lambda: status(cluster, "pj").get("retryCount") == 1, "the restart")
    cluster.wait(lambda: cluster.pods("pj") == [], "the Pods to go")

