"""Indexed Jobs and JobSets behind a real kube-apiserver, with Kubernetes' own Job controller and
garbage collector (kube-controller-manager, ``../shared/real-kubernetes.md``) making and deleting
what they make in a cluster (docs/workloads.md).

- An Indexed Job created through the API server: its Pods are made by the Job controller and wired by
  ``serve --job-source=kube`` (a subprocess holding exactly the manifests' RBAC) on the way in; read
  back, each has the environment the chain gives offline, and torchrun's variables rank the Pods by
  completion index. The reconciler (same RBAC) makes the Job's objects, owned by it; deleting the
  Job, the garbage collector deletes them (the reconciler stopped first: it is the collector's work).
- The same collection for a Volcano Job's objects.
- A JobSet (a permissive CRD, registered before the controller-manager starts so its collector
  knows the kind): Pods created as JobSet's child Jobs make them, wired on the way in; the
  ``reconcile`` command makes its objects; /validate refuses a workload whose plugins would fail.

Skipped unless ``KUBEBUILDER_ASSETS`` holds kube-apiserver, etcd and kube-controller-manager.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes.client.rest import ApiException

from tests.helpers.cluster import product_reconciler
from tests.helpers.envtest import (
    WEBHOOK_USER,
    EnvTest,
    Process,
    apply,
    controller_manager,
    create,
    delete,
    install_jobset_crd,
    new_namespace,
    read,
    request,
    resource_path,
    serving_webhook,
    status_message,
    wait_until,
    webhook_configurations,
)
from tests.helpers.jobs import example_job
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain, read_workload
from volcano_job_webhook.plugins.keys import PLUGINS_ANNOTATION
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.reconciler import Reconciler

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workloads"
KINDS = {"ConfigMap": "v1", "Secret": "v1", "Service": "v1", "NetworkPolicy": "networking.k8s.io/v1"}
@pytest.fixture(scope="module")
def kcm(envtest: EnvTest, kube_admin: kube_client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    # The garbage collector learns kinds at start (and every 30 s): the JobSet CRD goes first.
    install_jobset_crd(kube_admin)
    with controller_manager(envtest, tmp_path_factory.mktemp("kcm")) as process:
        yield process


@pytest.fixture(scope="module")
def wired(envtest: EnvTest, kube_admin: kube_client.ApiClient, kcm: Process,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The webhook serving and its registrations (every entry of the manifests) in effect; yields
    its settings file."""
    workdir = tmp_path_factory.mktemp("webhook")
    config = workdir / "config.yaml"
    config.write_text("volcano_controller_plugins: []\n", encoding="utf-8")
    with serving_webhook(workdir, envtest.kubeconfig(WEBHOOK_USER), f"--config={config}") as served:
        configs = webhook_configurations(served.base_url, served.ca_bundle)
        for obj in configs:
            apply(kube_admin, obj)
        try:
            yield config
        finally:
            for obj in configs:
                delete(kube_admin, "admissionregistration.k8s.io/v1", obj["kind"], obj["metadata"]["name"])


def objects(api: kube_client.ApiClient, namespace: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for kind, api_version in KINDS.items():
        for obj in request(api, "GET", resource_path(api, api_version, kind, namespace))["items"]:
            if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "volcano-job-webhook":
                out[(kind, obj["metadata"]["name"])] = obj
    return out


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def pods(api: kube_client.ApiClient, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = request(api, "GET", f"/api/v1/namespaces/{namespace}/pods",
                                          query=[("labelSelector", selector)])["items"]
    return items


def test_the_job_controllers_pods_are_wired_and_the_collector_takes_the_objects(
        envtest: EnvTest, kube_admin: kube_client.ApiClient, wired: Path) -> None:
    import yaml

    namespace = new_namespace(kube_admin, "indexed-")
    job_obj = yaml.safe_load((EXAMPLES / "torchrun-indexed-job.yaml").read_text())
    job_obj["metadata"] = {**job_obj["metadata"], "namespace": namespace}
    reconciler = Reconciler(envtest.api_client(WEBHOOK_USER), WebhookSettings(namespaces=[namespace], resync_seconds=3600,
                                                                             workloads=["jobs.batch"]), Chain())
    reconciler.start()
    try:
        wait_until(lambda: reconciler.manager.ready, 15, "the reconciler's caches")
        job = create(kube_admin, job_obj)
        made = wait_until(lambda: (lambda p: p if len(p) == 3 else None)(
            pods(kube_admin, namespace, "batch.kubernetes.io/job-name=torchrun-indexed")), 20, "the Job controller's 3 Pods")
        view = read_workload(job)
        for pod in made:
            index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            variables = env_of(pod)
            assert variables["PET_NODE_RANK"] == index and variables["PET_NNODES"] == "3", json.dumps(pod)
            assert variables["PET_MASTER_ADDR"] == "torchrun-indexed-0.torchrun-indexed"
            assert pod["spec"]["hostname"] == f"torchrun-indexed-{index}" and pod["spec"]["subdomain"] == "torchrun-indexed"
            offline = env_of(Chain().mutate(view, make_pod(view, view.tasks[0].name, int(index))).pod)
            assert {k: v for k, v in variables.items() if k.startswith("PET_")} == {k: v for k, v in offline.items() if k.startswith("PET_")}
        wanted = {("ConfigMap", "torchrun-indexed-svc"), ("Service", "torchrun-indexed"), ("NetworkPolicy", "torchrun-indexed")}
        wait_until(lambda: wanted <= set(objects(kube_admin, namespace)), 15, "the Job's objects")
        for obj in objects(kube_admin, namespace).values():
            (ref,) = obj["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["uid"]) == ("Job", job["metadata"]["uid"])
    finally:
        reconciler.stop()
    request(kube_admin, "DELETE", resource_path(kube_admin, "batch/v1", "Job", namespace, "torchrun-indexed"),
            body={"propagationPolicy": "Background"})
    wait_until(lambda: not objects(kube_admin, namespace), 20, "the garbage collector to delete the Job's objects")


def test_the_collector_takes_a_volcano_jobs_objects(envtest: EnvTest, kube_admin: kube_client.ApiClient,
                                                    kcm: Process) -> None:
    namespace = new_namespace(kube_admin, "volcano-gc-")
    reconciler = Reconciler(envtest.api_client(WEBHOOK_USER), WebhookSettings(namespaces=[namespace], resync_seconds=3600, workloads=[]),
                            Chain())
    reconciler.start()
    try:
        wait_until(lambda: reconciler.manager.ready, 15, "the reconciler's caches")
        create(kube_admin, example_job("svc", namespace))
        wait_until(lambda: len(objects(kube_admin, namespace)) == 3, 15, "the Volcano Job's objects")
    finally:
        reconciler.stop()
    delete(kube_admin, "batch.volcano.sh/v1alpha1", "Job", "svc-demo", namespace)
    wait_until(lambda: not objects(kube_admin, namespace), 20, "the garbage collector to delete the Volcano Job's objects")


def test_a_jobsets_pods_are_wired_on_the_way_in_and_reconcile_makes_its_objects(
        envtest: EnvTest, kube_admin: kube_client.ApiClient, wired: Path, tmp_path: Path) -> None:
    """Also the ``reconcile`` command on the same settings (the workloads it takes by default): the
    JobSet's objects made, and no Service of ours (JobSet makes its own); and /validate refusing,
    through the API server, an Indexed Job whose plugins would fail, naming it and the argument."""
    import yaml

    namespace = new_namespace(kube_admin, "jobset-")
    obj = yaml.safe_load((EXAMPLES / "jax-jobset.yaml").read_text())
    obj["metadata"] = {**obj["metadata"], "namespace": namespace}
    with product_reconciler(envtest.kubeconfig(WEBHOOK_USER), namespace, tmp_path, f"--config={wired}"):
        jobset = create(kube_admin, obj)
        wait_until(lambda: ("ConfigMap", "jax-jobset-svc") in objects(kube_admin, namespace), 15, "the JobSet's objects")
        assert ("Service", "jax-jobset") not in objects(kube_admin, namespace)
    bad = yaml.safe_load((EXAMPLES / "torchrun-indexed-job.yaml").read_text())
    bad["metadata"] = {**bad["metadata"], "name": "bad", "namespace": namespace}
    bad["metadata"]["annotations"][PLUGINS_ANNOTATION] = json.dumps({"svc": ["--no-such-flag"]})
    with pytest.raises(ApiException) as refused:
        create(kube_admin, bad)
    assert f"{namespace}/bad" in status_message(refused.value) and "--no-such-flag" in status_message(refused.value)
    view = read_workload(jobset)
    for task in view.tasks:
        for index in range(task.replicas):
            pod = make_pod(view, task.name, index)
            pod["metadata"]["namespace"] = namespace
            # The child Jobs JobSet would make are not made here: no owner, and no Job controller's finalizer.
            del pod["metadata"]["ownerReferences"], pod["metadata"]["finalizers"]
            stored = create(kube_admin, pod)
            variables = env_of(stored)
            offline = env_of(Chain().mutate(view, make_pod(view, task.name, index)).pod)
            assert variables["JAX_PROCESS_ID"] == offline["JAX_PROCESS_ID"]
            assert variables["JAX_COORDINATOR_ADDRESS"] == "jax-jobset-leader-0-0.jax-jobset:6666"
    assert read(kube_admin, "jobset.x-k8s.io/v1alpha2", "JobSet", "jax-jobset", namespace) is not None
