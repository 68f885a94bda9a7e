"""Installing, serving, crashing, upgrading and uninstalling beside a real kube-apiserver: no step
refuses a Volcano Pod because the webhook is not serving, and once registered it stays fail-closed.

One scenario, in the order an operator meets it, on an API server of its own with the install's
RBAC as it ships (bound to ServiceAccounts, whose names are token users here) and
kube-controller-manager's garbage collector:

0. Installed before Volcano's CRDs, ``serve`` is ready (no Job can exist yet) and serves Jobs once
   the CRDs are there.
1. ``kubectl apply -k manifests`` while its Deployment cannot run (no kubelet here: it never gets a
   Pod): nothing is registered, and a Volcano job's Pods are admitted as if it were not installed.
2. The webhook serves: ``serve`` and ``reconcile`` run as processes under the install's own identity
   with the install's settings file, the one change being ``clientConfig.url`` for ``service`` (an
   API server without kube-proxy reaches a webhook no other way) and ``serve``'s own certificate for
   127.0.0.1. The reconciler registers the webhook, and the next Pod is wired on its way in.
3. The webhook stops (a crash): the registration stays and an unwired Pod is refused, as Volcano
   expects (it retries); it serves again: the Pod is admitted, wired.
4. ``kubectl apply -k`` again with a new image (an upgrade) goes through with no other step.
5. ``kubectl delete -k manifests`` with the reconciler still running: the garbage collector deletes
   the registrations with the install's ClusterRole, the reconciler registers nothing again, and a
   Pod is admitted as before the install.

Skipped unless ``KUBEBUILDER_ASSETS`` holds kube-apiserver, etcd and kube-controller-manager, and a
kubectl renders the manifests.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import (
    EnvTest,
    controller_manager,
    create,
    find_assets,
    install_job_crd,
    new_namespace,
    read,
    serving_webhook,
    start_product,
    status_message,
    wait_until,
)
from tests.helpers.jobs import job_owner, volcano_job
from tests.helpers.kustomize import MANIFESTS, build, kubectl_or_skip
from volcano_job_webhook.plugins import Job
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.admission import admission_review

NAMESPACE = "volcano-job-webhook"
CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
WIRED = "VC_TASK_INDEX"  # what the job's annotation asks of the webhook (env)


def account_user(name: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{name}"


@pytest.fixture(scope="module")
def install() -> list[dict[str, Any]]:
    return build(MANIFESTS)


@pytest.fixture(scope="module")
def cluster(install: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvTest]:
    assets = find_assets()
    if assets is None:
        pytest.skip("KUBEBUILDER_ASSETS is not set to a directory with kube-apiserver and etcd")
    accounts = sorted({obj["metadata"]["name"] for obj in install if obj["kind"] == "ServiceAccount"})
    server = EnvTest(assets, tmp_path_factory.mktemp("install"), users=tuple(map(account_user, accounts)))
    with server, controller_manager(server, server.workdir, ("garbage-collector-controller",)):
        yield server


def kubectl(cluster: EnvTest, *args: str, cwd: Path | None = None) -> None:
    done = subprocess.run([str(kubectl_or_skip()), f"--kubeconfig={cluster.kubeconfig()}", *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd=cwd)
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def registrations(cluster: EnvTest) -> dict[str, Any]:
    api = cluster.api_client()
    return {kind: read(api, "admissionregistration.k8s.io/v1", kind, NAMESPACE) for kind in CONFIGURATIONS}


def local_settings(install: list[dict[str, Any]], workdir: Path, webhook_url: str) -> Path:
    """The install's settings as files, each webhook at ``webhook_url`` + its path, and ``serve``
    making its own certificate (127.0.0.1) rather than reading the install's Secret."""
    (settings,) = [o for o in install if o["kind"] == "ConfigMap" and "webhooks.yaml" in (o.get("data") or {})]
    config = yaml.safe_load(settings["data"]["config.yaml"]) or {}
    templates = yaml.safe_load(settings["data"]["webhooks.yaml"])
    for template in templates:
        for hook in template["webhooks"]:
            hook["clientConfig"] = {"url": webhook_url + hook["clientConfig"]["service"].get("path", "/")}
    (workdir / "webhooks.yaml").write_text(yaml.safe_dump(templates))
    config.update(webhook_configurations=str(workdir / "webhooks.yaml"), certs_from_secret=False, ca_secret=None)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    return workdir / "config.yaml"


def account_running(install: list[dict[str, Any]], command: str) -> str:
    """The ServiceAccount of the install's Pods whose container runs ``command`` (serve, reconcile)."""
    (account,) = {d["spec"]["template"]["spec"]["serviceAccountName"] for d in install if d["kind"] == "Deployment"
                  for c in d["spec"]["template"]["spec"]["containers"] if (c.get("args") or [None])[0] == command}
    return account_user(account)


def create_pod(cluster: EnvTest, job: dict[str, Any], index: int) -> dict[str, Any]:
    """Pod ``index`` of the job's worker task, as Volcano's controller creates it."""
    pod = make_pod(Job.from_object(job), "worker", index)
    pod["metadata"].update(namespace=job["metadata"]["namespace"], ownerReferences=[job_owner(job)])
    return create(cluster.api_client(), pod)


def wired(pod: dict[str, Any]) -> bool:
    return WIRED in {e["name"] for e in pod["spec"]["containers"][0].get("env") or []}


def test_serve_is_ready_before_volcanos_crds_exist_and_serves_jobs_once_they_do(
        cluster: EnvTest, install: list[dict[str, Any]], tmp_path: Path) -> None:
    admin = cluster.api_client()
    kubectl(cluster, "apply", "--server-side", "-k", str(MANIFESTS))  # its RBAC, for serve's identity
    with serving_webhook(tmp_path, cluster.kubeconfig(account_running(install, "serve"))) as served:  # ready: no CRD yet
        install_job_crd(admin)
        namespace = new_namespace(admin, "early-")
        job = create(admin, volcano_job("early", namespace=namespace, tasks=[("worker", 2)], annotation={"env": []}))
        pod = make_pod(Job.from_object(job), "worker", 1)
        pod["metadata"].update(namespace=namespace, ownerReferences=[job_owner(job)])
        review = admission_review(pod, uid="u-1")
        context = ssl.create_default_context(cadata=served.ca_bundle.decode())

        def patched() -> bool:
            request = urllib.request.Request(f"{served.base_url}/mutate", data=json.dumps(review).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, context=context, timeout=5) as answer:
                response = json.load(answer)["response"]
            return WIRED in base64.b64decode(response.get("patch") or "").decode()

        wait_until(patched, 15, "the Pod of a Job created after the CRD wired")


def test_no_step_refuses_a_pod_for_want_of_a_webhook_and_a_crash_still_does(
        cluster: EnvTest, install: list[dict[str, Any]], tmp_path: Path) -> None:
    admin = cluster.api_client()
    namespace = new_namespace(admin, "jobs-")
    job = create(admin, volcano_job("demo", namespace=namespace, tasks=[("worker", 8)], annotation={"env": []}))

    # 1. Installed, nothing serving: nothing registered, Pods admitted.
    kubectl(cluster, "apply", "--server-side", "-k", str(MANIFESTS))
    assert registrations(cluster) == dict.fromkeys(CONFIGURATIONS)
    assert not wired(create_pod(cluster, job, 0))

    # 2. Serving: registered by the reconciler, the next Pod wired.
    webhook_config = cluster.kubeconfig(account_running(install, "serve"))
    with serving_webhook(tmp_path / "serve", webhook_config) as served:
        create(admin, {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                       "metadata": {"name": "volcano-job-webhook-tls", "namespace": NAMESPACE},
                       "data": {"ca.crt": base64.b64encode(served.ca_bundle).decode(), "tls.crt": "", "tls.key": ""}})
        config = local_settings(install, tmp_path, served.base_url)
        reconciler = start_product(["reconcile", f"--kubeconfig={cluster.kubeconfig(account_running(install, 'reconcile'))}",
                                    f"--config={config}", "--health-port=0"], tmp_path / "reconcile.log")
        try:
            wait_until(lambda: None not in registrations(cluster).values(), 30, "the registrations",
                       log=lambda: reconciler.log(tail=30))
            for obj in registrations(cluster).values():
                assert {h["clientConfig"]["caBundle"] for h in obj["webhooks"]} == {base64.b64encode(served.ca_bundle).decode()}
                assert [(o["kind"], o["name"]) for o in obj["metadata"]["ownerReferences"]] == [("ClusterRole", NAMESPACE)]
            indexes = iter(range(1, 5))  # a newly registered webhook takes about a second to take effect
            wait_until(lambda: wired(create_pod(cluster, job, next(indexes))), 4, "a Pod wired through the registration")

            # 3. A crash: still registered, and an unwired Pod refused.
            served.process.stop()
            with pytest.raises(ApiException) as refused:
                create_pod(cluster, job, 5)
            assert "failed calling webhook" in status_message(refused.value)
            assert None not in registrations(cluster).values()
            with serving_webhook(tmp_path / "serve", webhook_config, port=int(served.base_url.rsplit(":", 1)[1])):
                assert wired(create_pod(cluster, job, 5))

                # 4. An upgrade: a new image, applied; nothing else to do.
                overlay = tmp_path / "upgrade"
                overlay.mkdir()
                (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
                    "resources": [os.path.relpath(MANIFESTS, overlay)],  # kustomize takes no absolute root
                    "images": [{"name": "ghcr.io/volcano-job-webhook/volcano-job-webhook", "newTag": "0.1.1"}]}))
                kubectl(cluster, "apply", "--server-side", "-k", str(overlay))

            # 5. Uninstalled with the reconciler still running: the collector takes the
            # registrations, nothing registers them again, and Pods are admitted.
            kubectl(cluster, "delete", "-k", str(MANIFESTS), "--wait=false")
            wait_until(lambda: registrations(cluster) == dict.fromkeys(CONFIGURATIONS), 30, "the registrations collected",
                       log=lambda: reconciler.log(tail=30))
            assert not wired(create_pod(cluster, job, 6))
            assert reconciler.alive and registrations(cluster) == dict.fromkeys(CONFIGURATIONS)
        finally:
            reconciler.stop()
