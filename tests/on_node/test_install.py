"""Installed on a real node, as an operator installs it (issue #26 part 7).

The one-node cluster of tests/on_node/conftest.py (real parts, cluster DNS, a whole Volcano: its
scheduler moves each PodGroup to ``Inqueue`` itself) with the image built from the Dockerfile
imported into the node's containerd. Then, in docs/install.md's order:

1. **Helm (recommended)**: ``helm install`` with the image values pointing at the local image, the
   namespace labelled, the Deployment Available. From the moment of install until 5 s after
   Available a Volcano Pod is created every 0.2 s: none is refused, and once the reconciler has
   registered the webhook they come back wired.
2. A Volcano Job whose Pods Volcano's own controller makes (``spec.plugins: {svc: []}``, the
   annotation asking the webhook for ``env``): every Pod comes back with ``VC_TASK_INDEX`` from the
   webhook, called by the API server through the webhook's Service (the registration names the
   Service, no URL), and Volcano's ``svc`` wiring beside it, each variable once.
3. ``kubectl rollout restart`` under 5 Pod creations a second: 0 refusals of 300.
4. ``helm uninstall`` and ``kubectl delete namespace``: nothing of the install is left (objects, the
   webhook registrations), and Pods are admitted (unwired) afterwards.
5. The same install, window, wiring and uninstall with ``kubectl apply -k`` / ``delete -k`` of an
   overlay naming the local image.

The figures (bring-up, time to Ready and Available, refusals in each phase, admission latencies,
teardown) are printed at the end (visible with ``-s``) and written to ``node-install.json``;
docs/benchmarks.md ("Installed on a real node") records a run. Skips as the conftest says.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from tests import node as node_module
from tests.envtest import create, read, request, status_message, wait_until
from tests.helm import CHART
from tests.jobs import job_owner, volcano_job
from tests.kustomize import MANIFESTS
from tests.on_node.conftest import Cluster, Figures, figures_fixture
from tests.test_image import TAG
from volcano_job_webhook.plugins import Job
from volcano_job_webhook.plugins.podgen import make_pod

NAMESPACE = "volcano-job-webhook"  # the release's, as docs/install.md installs it
RELEASE = "volcano-job-webhook"
DEPLOYMENT = "volcano-job-webhook"
CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
REPOSITORY, _, IMAGE_TAG = TAG.rpartition(":")
WIRED = "VC_TASK_INDEX"  # what the job annotation asks of the webhook (env)
INTERVAL = 0.2  # seconds between Pod creations: 5 a second
AFTER_AVAILABLE = 5.0  # the install window runs until this long after Available
ROLLOUT_PODS = 300


figures = figures_fixture("node-install", "Installed on a real node")


# Pods created while something happens ----------------------------------------------------------------


@dataclass
class Outcome:
    at: float  # seconds since the stream started
    result: str  # wired, unwired, refused (an error naming the webhook), error
    seconds: float  # how long the create took
    message: str = ""


class PodStream:
    """Creates a Pod of Volcano Job ``job`` (as Volcano's controller would: labels, annotations,
    owner reference) every ``interval`` seconds in a thread of its own, until stopped or ``limit``
    Pods; records each outcome."""

    def __init__(self, cluster: Cluster, job: dict[str, Any], phase: str, limit: int | None = None) -> None:
        self.api = cluster.node.api_client()
        self.job, self.phase, self.limit = job, phase, limit
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pods-{phase}", daemon=True)
        self.started = 0.0

    def __enter__(self) -> PodStream:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def wait(self, timeout: float) -> None:
        """Until ``limit`` Pods are created."""
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), f"{len(self.outcomes)} of {self.limit} Pods in {timeout:.0f} s"

    def _run(self) -> None:
        replicas = self.job["spec"]["tasks"][0]["replicas"]
        i = 0
        while not self._stop.is_set() and (self.limit is None or i < self.limit):
            pod = make_pod(Job.from_object(self.job), "worker", i % replicas)
            pod["metadata"].update(name=f"{self.job['metadata']['name']}-{self.phase.replace('_', '-')}-{i}",
                                   namespace=self.job["metadata"]["namespace"], ownerReferences=[job_owner(self.job)])
            begun = time.monotonic()
            try:
                made = create(self.api, pod)
                env = {e["name"] for e in made["spec"]["containers"][0].get("env") or []}
                outcome = Outcome(begun - self.started, "wired" if WIRED in env else "unwired", time.monotonic() - begun)
            except ApiException as exc:
                message = status_message(exc)
                result = "refused" if "webhook" in message else "error"
                outcome = Outcome(begun - self.started, result, time.monotonic() - begun, message)
            except Exception as exc:  # anything else ends the stream, as an error the test reports
                self.outcomes.append(Outcome(begun - self.started, "error", time.monotonic() - begun, repr(exc)))
                return
            self.outcomes.append(outcome)
            i += 1
            self._stop.wait(max(0.0, self.started + i * INTERVAL - time.monotonic()))

    def count(self, result: str) -> int:
        return sum(o.result == result for o in self.outcomes)

    def record(self, figures: Figures, prefix: str) -> None:
        figures[f"{prefix}_pods"] = len(self.outcomes)
        for result in ("wired", "unwired", "refused", "error"):
            figures[f"{prefix}_{result}"] = self.count(result)
        latencies = sorted(o.seconds * 1000 for o in self.outcomes if o.result in ("wired", "unwired"))
        if latencies:
            figures[f"{prefix}_create_ms_p50"] = statistics.median(latencies)
            figures[f"{prefix}_create_ms_max"] = latencies[-1]

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result in ("refused", "error")]


# The steps ------------------------------------------------------------------------------------------


def window_job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """A Volcano Job whose Pods the streams create; it asks for more CPU than the node has, so
    vc-scheduler never moves it to Inqueue and Volcano's controller makes no Pods of its own."""
    job = volcano_job(name, namespace=namespace, tasks=[("worker", 4)], annotation={"env": []},
                      schedulerName="volcano", minAvailable=4)
    job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1000"}}
    return create(cluster.admin, job)


def registrations(cluster: Cluster) -> dict[str, Any]:
    return {kind: read(cluster.admin, "admissionregistration.k8s.io/v1", kind, RELEASE) for kind in CONFIGURATIONS}


def deployment_available(cluster: Cluster, name: str = DEPLOYMENT) -> bool:
    found = read(cluster.admin, "apps/v1", "Deployment", name, NAMESPACE) or {}
    status, spec = found.get("status") or {}, found.get("spec") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    replicas = spec.get("replicas", 1)
    return (conditions.get("Available") == "True" and status.get("observedGeneration") == found["metadata"]["generation"]
            and status.get("updatedReplicas") == status.get("readyReplicas") == status.get("availableReplicas") == replicas
            and not status.get("unavailableReplicas"))


def webhook_pods_ready(cluster: Cluster) -> int:
    pods = request(cluster.admin, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                   query=[("labelSelector", "app.kubernetes.io/component=webhook")])["items"]
    return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
               for p in pods)


def install_window(cluster: Cluster, figures: Figures, prefix: str, install: list[list[str]], job: dict[str, Any]) -> None:
    """Pods every 0.2 s from the moment ``install`` (kubectl/helm command lines) starts until 5 s after
    the Deployment is Available: none refused; the figures of the window."""
    marks = {}
    with PodStream(cluster, job, prefix) as stream:
        for command in install:
            tool = cluster.helm if command[0] == "helm" else cluster.kubectl
            tool(*command[1:])
        marks["installed"] = time.monotonic()

        def watch() -> bool:
            now = time.monotonic()
            if "ready" not in marks and webhook_pods_ready(cluster):
                marks["ready"] = now
            if "registered" not in marks and None not in registrations(cluster).values():
                marks["registered"] = now
            return deployment_available(cluster)

        wait_until(watch, 120, "the Deployment Available", interval=0.1,
                   log=lambda: cluster.kubectl("-n", NAMESPACE, "get", "all,events") + cluster.node.logs())
        marks["available"] = time.monotonic()
        end = marks["available"] + AFTER_AVAILABLE
        while time.monotonic() < end:
            watch()
            time.sleep(0.1)
        stream.stop()
    for name, at in marks.items():
        figures[f"{prefix}_{name}_s"] = at - stream.started
    wired = [o.at for o in stream.outcomes if o.result == "wired"]
    figures[f"{prefix}_first_wired_s"] = wired[0] if wired else None
    stream.record(figures, f"{prefix}_window")
    assert not stream.failures(), stream.failures()[:5]
    assert "registered" in marks, "Available, and 5 s later still no webhook registration"
    assert stream.outcomes[-1].result == "wired", "the last Pod of the window, 5 s after Available, was not wired"
    assert [o.result for o in stream.outcomes] == sorted(o.result for o in stream.outcomes), (
        "unwired Pods after wired ones: " + "".join("w" if o.result == "wired" else "u" for o in stream.outcomes))


def check_wiring(cluster: Cluster, figures: Figures, prefix: str, namespace: str, name: str) -> None:
    """A Volcano Job's own Pods, made by Volcano's controller, come back wired by the webhook
    through its Service (the registrations name it, and no URL), Volcano's svc wiring beside it."""
    for obj in registrations(cluster).values():
        for hook in obj["webhooks"]:
            assert hook["clientConfig"]["service"]["namespace"] == NAMESPACE and "url" not in hook["clientConfig"], hook
    volcano = cluster.volcano(namespace)
    volcano.create(volcano_job(name, namespace=namespace, tasks=[("master", 1), ("worker", 2)], plugins={"svc": []},
                               annotation={"env": []}, schedulerName="volcano", minAvailable=3))
    started = time.monotonic()

    def made() -> list[dict[str, Any]]:
        pods = volcano.pods(name)
        return pods if len(pods) == 3 else []

    pods = volcano.wait(made, f"Volcano's Pods of {name}")
    figures[f"{prefix}_volcano_pods_s"] = time.monotonic() - started
    for pod in pods:
        env = [e["name"] for e in pod["spec"]["containers"][0].get("env") or []]
        index = pod["metadata"]["annotations"]["volcano.sh/task-index"]
        assert {"name": WIRED, "value": index} in pod["spec"]["containers"][0]["env"], (pod["metadata"]["name"], env)
        assert "VC_WORKER_HOSTS" in env and pod["spec"].get("subdomain") == name, "Volcano's own svc wiring"
        assert len(env) == len(set(env)), f"a variable twice in {pod['metadata']['name']}: {env}"


def rolling_restart(cluster: Cluster, figures: Figures, prefix: str, job: dict[str, Any]) -> None:
    """``kubectl rollout restart`` under 5 Pod creations a second: none of 300 refused, all wired."""
    with PodStream(cluster, job, prefix, limit=ROLLOUT_PODS) as stream:
        time.sleep(1.0)
        begun = time.monotonic()
        cluster.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{DEPLOYMENT}")
        cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=120s", timeout=150)
        figures[f"{prefix}_rollout_s"] = time.monotonic() - begun
        stream.wait(ROLLOUT_PODS * INTERVAL + 60)
    stream.record(figures, prefix)
    assert len(stream.outcomes) == ROLLOUT_PODS
    assert not stream.failures(), stream.failures()[:5]
    assert stream.count("wired") == ROLLOUT_PODS


def leftovers(cluster: Cluster) -> list[str]:
    """What of an install is still in the cluster: the namespace, cluster-scoped objects named after
    the release, the webhook registrations."""
    found = []
    if read(cluster.admin, "v1", "Namespace", NAMESPACE):
        found.append(f"Namespace {NAMESPACE}")
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        items = request(cluster.admin, "GET", f"/apis/rbac.authorization.k8s.io/v1/{kind.lower()}s")["items"]
        found += [f"{kind} {o['metadata']['name']}" for o in items if o["metadata"]["name"].startswith(RELEASE)]
    found += [f"{kind} {RELEASE}" for kind, obj in registrations(cluster).items() if obj]
    return found


def uninstall(cluster: Cluster, figures: Figures, prefix: str, commands: list[list[str]], job: dict[str, Any]) -> None:
    """The uninstall commands under Pod creations (their refusals a figure: docs/install.md allows a
    few seconds of them), until nothing of the install is left; then Pods are admitted unwired."""
    with PodStream(cluster, job, prefix) as stream:
        time.sleep(1.0)
        begun = time.monotonic()
        for command in commands:
            tool = cluster.helm if command[0] == "helm" else cluster.kubectl
            tool(*command[1:])
        wait_until(lambda: not leftovers(cluster), 120, "nothing of the install left", interval=0.2,
                   log=lambda: "left: " + ", ".join(leftovers(cluster)))
        figures[f"{prefix}_clean_s"] = time.monotonic() - begun
        time.sleep(2.0)
    stream.record(figures, prefix)
    assert not [o for o in stream.outcomes if o.result == "error"], stream.failures()[:5]
    after = [o.result for o in stream.outcomes if o.at > figures.values[f"{prefix}_clean_s"] + 1.0]
    assert after and set(after) == {"unwired"}, after


def overlay(directory: Path) -> Path:
    """What docs/install.md tells an operator to write: an overlay naming their image."""
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS, directory)],  # kustomize refuses an absolute path
        "images": [{"name": "ghcr.io/volcano-job-webhook/volcano-job-webhook", "newName": REPOSITORY, "newTag": IMAGE_TAG}],
    }))
    return directory


# The tests ------------------------------------------------------------------------------------------


def test_pods_reach_the_api_server_through_its_service_and_nothing_off_the_machine(cluster: Cluster) -> None:
    """The node's network as the product's Pods meet it: the kubernetes Service answers, and an
    address off this machine (its default gateway, a public one) has no route from a Pod."""
    gateway = node_module.run("ip", "-4", "route", "show", "default").stdout.split()[2]
    script = (f"for target in 10.96.0.1:443 {gateway}:53 1.1.1.1:443; do "
              "nc -w 2 ${target%:*} ${target#*:} </dev/null 2>/dev/null && echo $target open || echo $target closed; done")
    namespace = cluster.namespace("network-")
    create(cluster.admin, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": namespace},
                           "spec": {"restartPolicy": "Never", "containers": [{
                               "name": "probe", "image": node_module.PAUSE_IMAGE, "imagePullPolicy": "Never",
                               "command": ["/bin/busybox", "sh", "-c", script]}]}})

    def finished() -> str:
        pod = read(cluster.admin, "v1", "Pod", "probe", namespace) or {}
        return str((pod.get("status") or {}).get("phase")) if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") else ""

    assert wait_until(finished, 60, "the probe Pod to finish", log=cluster.node.logs) == "Succeeded"
    assert cluster.kubectl("-n", namespace, "logs", "probe").split("\n")[:3] == [
        "10.96.0.1:443 open", f"{gateway}:53 closed", "1.1.1.1:443 closed"]


def test_helm_install_window_wiring_rollout_and_uninstall(cluster: Cluster, figures: Figures) -> None:
    namespace = cluster.namespace("helm-")
    job = window_job(cluster, namespace, "window")
    install_window(cluster, figures, "helm", [
        ["helm", "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
         f"--set=image.repository={REPOSITORY}", f"--set=image.tag={IMAGE_TAG}", "--set=image.pullPolicy=Never"],
        ["kubectl", "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted"],
    ], job)
    check_wiring(cluster, figures, "helm", namespace, "wired")
    rolling_restart(cluster, figures, "helm_rollout", job)
    uninstall(cluster, figures, "helm_uninstall", [
        ["helm", "uninstall", RELEASE, "-n", NAMESPACE],
        ["kubectl", "delete", "namespace", NAMESPACE, "--wait=false"],
    ], job)


def test_kustomize_install_window_wiring_and_delete(cluster: Cluster, figures: Figures, tmp_path: Path) -> None:
    install = overlay(tmp_path / "my-install")
    namespace = cluster.namespace("kustomize-")
    job = window_job(cluster, namespace, "window")
    install_window(cluster, figures, "kustomize", [["kubectl", "apply", "-k", str(install)]], job)
    check_wiring(cluster, figures, "kustomize", namespace, "wired")
    uninstall(cluster, figures, "kustomize_delete", [["kubectl", "delete", "-k", str(install), "--wait=false"]], job)
