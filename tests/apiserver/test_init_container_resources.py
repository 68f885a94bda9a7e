"""The init containers we add (waitfor's ``wait-for-tasks``, svc's ``volcano-svc-hosts``) behind a
real kube-apiserver, in a namespace as a shared cluster sets one up: a LimitRange with a minimum
per container and a ResourceQuota on cpu and memory (its usage kept by kube-controller-manager's
quota controller). A Pod whose containers ask for what the LimitRange and quota want is created
with its init container, and keeps its QoS class (``Guaranteed``: every container's limits equal
its requests), which the API server computes. pytorch's ``wait-for-master``, kept as Volcano makes it
(no resources), is refused there as it is under Volcano.

Skipped unless ``KUBEBUILDER_ASSETS`` holds kube-apiserver, etcd and kube-controller-manager.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import EnvTest, Process, controller_manager, create, new_namespace, read, status_message, wait_until
from tests.helpers.jobs import INIT_CONTAINER_CASES, volcano_job
from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.podgen import make_pod

RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}


@pytest.fixture(scope="module")
def quota_controller(envtest: EnvTest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with controller_manager(envtest, tmp_path_factory.mktemp("kcm"), ("resourcequota-controller",)) as process:
        yield process


@pytest.fixture
def limited_namespace(kube_admin: kube_client.ApiClient, quota_controller: Process) -> str:
    """A namespace with a LimitRange minimum per container and a quota on cpu and memory, counted."""
    namespace = new_namespace(kube_admin)
    create(kube_admin, {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "limits", "namespace": namespace},
                        "spec": {"limits": [{"type": "Container", "min": {"cpu": "10m", "memory": "4Mi"}}]}})
    hard = {"requests.cpu": "4", "requests.memory": "4Gi", "limits.cpu": "4", "limits.memory": "4Gi"}
    create(kube_admin, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "quota", "namespace": namespace},
                        "spec": {"hard": hard}})
    wait_until(lambda: ((read(kube_admin, "v1", "ResourceQuota", "quota", namespace) or {}).get("status") or {}).get("used"),
               30, "the quota controller to count the namespace's usage")
    return namespace


def guaranteed_pod(namespace: str, plugins: dict[str, list[str]], tasks: list[tuple[str, int]], task: str) -> dict[str, Any]:
    """Pod 0 of ``task`` in a job whose containers are Guaranteed, as the chain wires it, owned by nothing."""
    job = Job.from_object(volcano_job("sized", plugins=plugins, tasks=tasks, namespace=namespace, uid="u-1",
                                      pod={"containers": [{"name": "main", "image": "x:1", "resources": RESOURCES}]}))
    pod: dict[str, Any] = Chain().mutate(job, make_pod(job, task, 0)).pod
    pod["metadata"].pop("ownerReferences", None)  # no Job here to own it
    return pod


@pytest.mark.parametrize("case", INIT_CONTAINER_CASES)
def test_a_pod_with_our_init_container_is_admitted_and_keeps_its_qos_class(
        case: str, kube_admin: kube_client.ApiClient, limited_namespace: str) -> None:
    plugins, tasks, task, init = INIT_CONTAINER_CASES[case]
    pod = guaranteed_pod(limited_namespace, plugins, tasks, task)
    assert init in [c["name"] for c in pod["spec"]["initContainers"]]
    try:
        created = create(kube_admin, pod)
    except ApiException as exc:
        pytest.fail(f"refused: {status_message(exc)}")
    assert [c["name"] for c in created["spec"]["initContainers"]] == [init]
    assert created["status"]["qosClass"] == "Guaranteed"


def test_pytorchs_wait_for_master_is_refused_there_as_under_volcano(kube_admin: kube_client.ApiClient, limited_namespace: str) -> None:
    """Volcano's own init container asks for nothing, and we keep it so (volcano-behaviour.md, quirk 22)."""
    pytorch = {"pytorch": ["--master=master", "--worker=worker", "--wait-master-enabled=true"]}
    pod = guaranteed_pod(limited_namespace, pytorch, [("master", 1), ("worker", 2)], "worker")
    with pytest.raises(ApiException) as info:
        create(kube_admin, pod)
    assert info.value.status == 403
    assert "must specify limits.cpu for: wait-for-master" in status_message(info.value)
