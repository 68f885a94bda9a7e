"""What a real kubelet starts a container with when the plugins' variables come first
(docs/plugins.md#variables-first-name-references-that-expand; tests/apiserver/test_env_placement.py has the
rule and the API server's side). Worker 1 of a job running env, svc and torchrun, once with placement
``first`` and once with the default, on the node of tests/on_node/conftest.py: the container prints
its environment."""

from __future__ import annotations

from kubernetes import client as kube_client

from tests.apiserver.test_env_placement import with_placement
from tests.helpers import node as node_module
from tests.helpers.envtest import create, read, wait_until
from tests.helpers.jobs import volcano_job
from tests.on_node.conftest import Cluster
from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.podgen import make_pod


def test_a_real_kubelet_starts_the_container_with_them_expanded(cluster: Cluster) -> None:
    api = cluster.admin
    namespace = cluster.namespace("placement-")
    own = [{"name": "NODE_RANK", "value": "$(PET_NODE_RANK)"}, {"name": "MY_HOST", "value": "worker-$(VC_TASK_INDEX)"},
           {"name": "PEERS", "value": "$(VC_WORKER_HOSTS)"}]
    printed: dict[str, dict[str, str]] = {}
    try:
        for name, placement in (("kf", "first"), ("kl", None)):
            obj = volcano_job(name, namespace=namespace, plugins={"env": []}, annotation={"torchrun": ["--nproc-per-node=1"]},
                              uid=f"uid-{name}", image=node_module.PAUSE_IMAGE, pod={"restartPolicy": "Never", "containers": [{
                                  "name": "main", "image": node_module.PAUSE_IMAGE, "imagePullPolicy": "Never",
                                  "command": ["/bin/busybox", "env"], "env": own}]})
            job = Job.from_object(with_placement(obj, placement))
            for side in Chain().resources(job):
                if side["kind"] == "ConfigMap":
                    side["metadata"].pop("ownerReferences")  # no Job object: the garbage collector would delete it
                    create(api, side)
            pod = Chain().mutate(job, make_pod(job, "worker", 1)).pod
            pod["metadata"].pop("ownerReferences")
            pod["spec"].pop("schedulerName")  # a lone Pod, no PodGroup: kube-scheduler places it
            create(api, pod)
            pod_name = pod["metadata"]["name"]

            def finished(pod_name: str = pod_name) -> str:
                phase = ((read(api, "v1", "Pod", pod_name, namespace) or {}).get("status") or {}).get("phase")
                return str(phase) if phase in ("Succeeded", "Failed") else ""

            assert wait_until(finished, 60, f"Pod {pod_name} to finish",
                              log=lambda pod_name=pod_name: f"{read(api, 'v1', 'Pod', pod_name, namespace)}\n{cluster.node.logs()}") == "Succeeded"
            log = kube_client.CoreV1Api(api).read_namespaced_pod_log(pod_name, namespace)
            printed[name] = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    hosts = "kf-worker-0.kf,kf-worker-1.kf"
    assert {k: printed["kf"][k] for k in ("NODE_RANK", "MY_HOST", "PEERS")} == {"NODE_RANK": "2", "MY_HOST": "worker-1", "PEERS": hosts}
    assert {k: printed["kl"][k] for k in ("NODE_RANK", "MY_HOST", "PEERS")} == {e["name"]: e["value"] for e in own}
