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
3. ``kubectl rollout restart`` under 5 Pod creations a second until the old Pods are gone: 0 refusals.
4. ``helm uninstall`` and ``kubectl delete namespace``: nothing of the install is left (objects, the
   webhook registrations), and Pods are admitted (unwired) afterwards.
5. The same install, window, wiring and uninstall with ``kubectl apply -k`` / ``delete -k`` of an
   overlay naming the local image, kube-proxy paused from the install until 5 s after Available (a
   node whose kube-proxy lags behind the endpoints): nothing is registered until it resumes, so no
   Pod meets a Service that routes nowhere.

A failed step removes its install, so that the next test's install does not wait for it.

The figures (bring-up, time to Ready and Available, refusals in each phase, admission latencies,
teardown) are printed at the end (visible with ``-s``) and written to ``node-install.json``;
docs/benchmarks.md ("Installed on a real node") records a run. Skips as the conftest says.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import node as node_module
from tests.helpers.envtest import create, read, request, wait_until
from tests.helpers.helm import CHART
from tests.helpers.jobs import volcano_job
from tests.helpers.kustomize import MANIFESTS
from tests.on_node.conftest import (
    DEPLOYMENT,
    IMAGE_TAG,
    NAMESPACE,
    RELEASE,
    REPOSITORY,
    WIRED,
    Cluster,
    Figures,
    PodStream,
    deployment_available,
    figures_fixture,
    registrations,
    unregistered,
    window_job,
)

AFTER_AVAILABLE = 5.0  # the install window runs until this long after Available


figures = figures_fixture("node-install", "Installed on a real node")


# The steps ------------------------------------------------------------------------------------------


def webhook_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return list(request(cluster.admin, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                        query=[("labelSelector", "app.kubernetes.io/component=webhook")])["items"])


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def webhook_pods_ready(cluster: Cluster) -> int:
    return sum(map(ready, webhook_pods(cluster)))


def run_commands(cluster: Cluster, commands: list[list[str]]) -> None:
    """kubectl and helm command lines, in order, through the cluster's tools."""
    for command in commands:
        (cluster.helm if command[0] == "helm" else cluster.kubectl)(*command[1:])


@contextlib.contextmanager
def kube_proxy_paused(cluster: Cluster) -> Iterator[Callable[[], None]]:
    """kube-proxy stopped (SIGSTOP) until the call this yields, or the end: the rules it made stay,
    a new Service gets none (a node whose kube-proxy lags behind the endpoints, as a busy one does)."""
    pid = cluster.node.processes["kube-proxy"].popen.pid
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "kube-proxy"
    os.kill(pid, signal.SIGSTOP)
    resume = functools.partial(os.kill, pid, signal.SIGCONT)
    try:
        yield resume
    finally:
        resume()


def install_window(cluster: Cluster, figures: Figures, prefix: str, install: list[list[str]], job: dict[str, Any],
                   lagging_proxy: bool = False) -> None:
    """Pods every 0.2 s from the moment ``install`` (kubectl/helm command lines) starts until 5 s after
    the Deployment is Available: none refused; the figures of the window. With ``lagging_proxy``
    kube-proxy is paused until then: nothing is registered while the Service routes nowhere, and 5 s
    after it resumes, the Pods are wired."""
    marks = {}
    with PodStream(cluster, job, prefix) as stream, kube_proxy_paused(cluster) if lagging_proxy else contextlib.nullcontext() as resume:
        run_commands(cluster, install)
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
        if resume is not None:
            assert "registered" not in marks, "registered while the Service routed nowhere: every Volcano Pod refused"
            resume()
            marks["proxy_resumed"] = time.monotonic()
            wait_until(lambda: watch() and "registered" in marks, 30, "the registration once kube-proxy runs", interval=0.1)
            time.sleep(max(0.0, marks["registered"] + AFTER_AVAILABLE - time.monotonic()))
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
    """``kubectl rollout restart`` under 5 Pod creations a second, from 1 s before it until the old
    Pods are gone and 5 s more: none refused, all wired."""
    with PodStream(cluster, job, prefix) as stream:
        time.sleep(1.0)
        begun = time.monotonic()
        cluster.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{DEPLOYMENT}")
        cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=120s", timeout=150)
        figures[f"{prefix}_rollout_s"] = time.monotonic() - begun
        def only_new() -> bool:
            pods = webhook_pods(cluster)
            return len(pods) == 2 and all(map(ready, pods))

        wait_until(only_new, 150, "the old webhook Pods gone (drained: the API server closes what it keeps within 90 s)", interval=0.5)
        time.sleep(AFTER_AVAILABLE)
    stream.record(figures, prefix)
    assert not stream.failures(), stream.failures()[:5]
    assert stream.count("wired") == len(stream.outcomes) > 0


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


def uninstall_under_pods(cluster: Cluster, figures: Figures, prefix: str, commands: list[list[str]], job: dict[str, Any]) -> None:
    """The uninstall commands under Pod creations (their refusals a figure: docs/install.md allows a
    few seconds of them), until nothing of the install is left; then Pods are admitted unwired."""
    with PodStream(cluster, job, prefix) as stream:
        time.sleep(1.0)
        begun = time.monotonic()
        run_commands(cluster, commands)
        unregistered(cluster)
        wait_until(lambda: not leftovers(cluster), 120, "nothing of the install left", interval=0.2,
                   log=lambda: "left: " + ", ".join(leftovers(cluster)))
        figures[f"{prefix}_clean_s"] = time.monotonic() - begun
        time.sleep(2.0)
    stream.record(figures, prefix)
    assert not [o for o in stream.outcomes if o.result == "error"], stream.failures()[:5]
    after = [o.result for o in stream.outcomes if o.at > figures.values[f"{prefix}_clean_s"] + 1.0]
    assert after and set(after) == {"unwired"}, after


@contextlib.contextmanager
def removed_on_failure(cluster: Cluster, commands: list[list[str]]) -> Iterator[None]:
    """On a failure inside, the install removed by ``commands`` before it propagates: the next test
    installs into the same namespace, and would otherwise fail waiting for it."""
    try:
        yield
    except BaseException:
        run_commands(cluster, commands)
        wait_until(lambda: not leftovers(cluster), 120, "nothing of the failed install left")
        raise


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
    uninstall = [["helm", "uninstall", RELEASE, "-n", NAMESPACE], ["kubectl", "delete", "namespace", NAMESPACE, "--wait=false"]]
    with removed_on_failure(cluster, uninstall):
        install_window(cluster, figures, "helm", [
            ["helm", "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
             f"--set=image.repository={REPOSITORY}", f"--set=image.tag={IMAGE_TAG}", "--set=image.pullPolicy=Never"],
            ["kubectl", "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted"],
        ], job)
        check_wiring(cluster, figures, "helm", namespace, "wired")
        rolling_restart(cluster, figures, "helm_rollout", job)
    uninstall_under_pods(cluster, figures, "helm_uninstall", uninstall, job)


def test_kustomize_install_window_wiring_and_delete(cluster: Cluster, figures: Figures, tmp_path: Path) -> None:
    install = overlay(tmp_path / "my-install")
    namespace = cluster.namespace("kustomize-")
    job = window_job(cluster, namespace, "window")
    delete = [["kubectl", "delete", "-k", str(install), "--wait=false"]]
    with removed_on_failure(cluster, delete):
        install_window(cluster, figures, "kustomize", [["kubectl", "apply", "-k", str(install)]], job, lagging_proxy=True)
        check_wiring(cluster, figures, "kustomize", namespace, "wired")
    uninstall_under_pods(cluster, figures, "kustomize_delete", delete, job)
