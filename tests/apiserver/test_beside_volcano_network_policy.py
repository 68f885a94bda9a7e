"""svc's NetworkPolicy flags and the ``cluster_domain`` setting beside Volcano's own job controller
(tests/helpers/cluster.py: the real ``vc-controller-manager``), with the product registered as an operator
runs it:

* our flags in ``spec.plugins.svc``, where Volcano's controller runs svc, stay Volcano's flag error:
  a running job (admitted before the webhook) gets Volcano's NetworkPolicy, the flag after ours
  unread, its Pods are admitted and nothing is ours to make; a new Job naming them is refused at
  ``/validate``;
* in the annotation, where svc is ours, the reconciler makes the opened policies and host files fully
  qualified in the configured domain, and the webhook wires the Pods with those names."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.helpers.cluster import VolcanoCluster, product_reconciler, product_webhook
from tests.helpers.envtest import status_message
from tests.helpers.jobs import scheduled_job
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL

OURS_ONLY = ["--allow-pods=app=prometheus", "--disable-network-policy"]


def _objects(c: VolcanoCluster, *, ours: bool) -> dict[tuple[str, str], dict[str, Any]]:
    return {(kind, o["metadata"]["name"]): o for kind in ("ConfigMap", "Service", "NetworkPolicy", "Secret") for o in c.list(kind)
            if ((o["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY) == ours
            and not o["metadata"]["name"].startswith("default-token")}


def _run_pods(c: VolcanoCluster, name: str) -> list[dict[str, Any]]:
    c.inqueue(name)
    return c.wait(lambda: len(found := c.pods(name)) == 3 and found, f"the Pods of {name}")


@pytest.fixture
def settings(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("cluster_domain: cluster.local\n")
    return path


def _start(stack: ExitStack, cluster: VolcanoCluster, workdir: Path, settings: Path) -> None:
    """The webhook and the reconciler, both on ``settings``, the webhook registered."""
    for name in ("serve", "reconcile"):
        (workdir / name).mkdir()
    webhook = stack.enter_context(product_webhook(cluster, workdir / "serve", f"--config={settings}"))
    stack.enter_context(product_reconciler(cluster.kubeconfig(workdir), cluster.namespace, workdir / "reconcile",
                                           f"--config={settings}", "--resync-seconds=1"))
    cluster.register_webhooks(webhook.base_url, webhook.ca_bundle)


@pytest.fixture
def product(cluster: VolcanoCluster, tmp_path: Path, settings: Path) -> Iterator[None]:
    with ExitStack() as stack:
        _start(stack, cluster, tmp_path, settings)
        yield


def test_our_svc_flags_where_volcano_runs_svc_stay_volcanos_flag_error(cluster, tmp_path, settings):
    # Admitted before the webhook was installed: Volcano's admission does not judge flags.
    cluster.create(scheduled_job("vf", plugins={"svc": OURS_ONLY}))
    cluster.wait(lambda: len(_objects(cluster, ours=False)) == 3, "Volcano's svc objects")
    volcanos = _objects(cluster, ours=False)
    # Go's flag stopped at --allow-pods: --disable-network-policy was not read, and the policy is Volcano's own.
    selector = {"volcano.sh/job-name": "vf", "volcano.sh/job-namespace": cluster.namespace}
    assert volcanos[("NetworkPolicy", "vf")]["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    with ExitStack() as stack:
        _start(stack, cluster, tmp_path, settings)
        pods = _run_pods(cluster, "vf")
        for pod in pods:  # wired by Volcano alone, with its short names
            env = {e["name"]: e for e in pod["spec"]["containers"][0].get("env") or []}
            assert {"VC_MASTER_HOSTS", "VC_WORKER_HOSTS"} <= set(env)
        cluster.settle()
        assert _objects(cluster, ours=True) == {}, "svc is Volcano's: nothing of it is ours to make"
        assert cluster.get("ConfigMap", "vf-svc")["data"]["VC_MASTER_HOSTS"] == "vf-master-0.vf"
        with pytest.raises(ApiException) as refused:
            cluster.create(scheduled_job("vn", plugins={"svc": OURS_ONLY}))
        assert "--allow-pods is a flag of this project's svc only" in status_message(refused.value)


def test_in_the_annotation_our_svc_makes_the_opened_policies_and_qualified_names(cluster, product):
    flags = ["--allow-namespaces=monitoring", "--allow-pods=*:app=prometheus", "--open-task-ports=master:22,metrics"]
    cluster.create(scheduled_job("af", annotation={"svc": flags, "torchrun": []}))
    cluster.wait(lambda: len(_objects(cluster, ours=True)) == 4, "our four objects")
    pods = _run_pods(cluster, "af")
    cluster.settle()
    assert _objects(cluster, ours=False) == {}, "Volcano makes nothing for plugins it is not told of"
    ours = _objects(cluster, ours=True)
    assert set(ours) == {("ConfigMap", "af-svc"), ("Service", "af"), ("NetworkPolicy", "af"), ("NetworkPolicy", "af-master-open")}
    peers = ours[("NetworkPolicy", "af")]["spec"]["ingress"][0]["from"]
    assert peers[1:] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
                         {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}}]
    opened = ours[("NetworkPolicy", "af-master-open")]["spec"]
    assert opened["podSelector"]["matchLabels"]["volcano.sh/task-spec"] == "master"
    assert opened["ingress"] == [{"ports": [{"protocol": "TCP", "port": 22}, {"protocol": "TCP", "port": "metrics"}]}]
    fqdn = f"af.{cluster.namespace}.svc.cluster.local"
    assert ours[("ConfigMap", "af-svc")]["data"]["VC_WORKER_HOSTS"] == f"af-worker-0.{fqdn},af-worker-1.{fqdn}"
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
        assert env["PET_MASTER_ADDR"] == f"af-master-0.{fqdn}"
