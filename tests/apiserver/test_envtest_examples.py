"""Every example as a user applies it, with kubectl on kube-apiserver: ``kubectl apply -f``, the
same again, ``kubectl apply --server-side``, ``kubectl delete -f`` and ``kubectl apply -f`` once more,
each of them succeeding on the file as it is (issue #41).

Two clusters, each its own kube-apiserver with Volcano's CRDs (``../shared/volcano-crds``), a
permissive JobSet CRD and this project's webhook registered as the manifests register it (its
``/validate`` sees every create and update of a Job):

- ``crds``: nothing else, so what is refused is refused by the API server or by us;
- ``volcano``: a whole Volcano too (``tests/cluster.py``'s ``whole_volcano``: its scheduler, its
  controllers, and its admission, which defaults fields of every Volcano Job it is sent and
  checks every update), as a cluster a user applies the examples to runs it.

The second apply must leave the Job ``unchanged``: on the ``volcano`` cluster that holds because
each task names ``minAvailable`` and ``maxRetry`` as Volcano's admission fills them in on create.
Without them kubectl's patch (a JSON merge patch: the file's ``spec.tasks`` whole) clears the two,
and Volcano's admission refuses the update ("job updates may not change fields other than
`minAvailable`, `tasks[*].replicas under spec` and `PriorityClassName`"): every Volcano Job example
failed so before. ``--server-side`` is not given ``--force-conflicts``: an example that only a
forced apply takes fails here. Skips without ``KUBEBUILDER_ASSETS``, kubectl or Volcano's CRDs (the ``volcano`` cluster
also without ``VOLCANO_CONTROLLER``, ``VOLCANO_SCHEDULER`` and ``VOLCANO_ADMISSION``), saying which.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kube_client
from kubernetes.client.rest import ApiException

from tests.helpers.cluster import CRDS_ENV, crds_dir, install_volcano, volcano_missing, whole_volcano
from tests.helpers.envtest import (
    ASSETS_ENV,
    WEBHOOK_USER,
    EnvTest,
    apply,
    create,
    find_assets,
    install_jobset_crd,
    serving_webhook,
    status_message,
    wait_until,
    webhook_configurations,
)
from tests.helpers.kustomize import kubectl_or_skip
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.plugins.keys import PLUGINS_ANNOTATION

EXAMPLE_FILES = sorted((EXAMPLES / "jobs").glob("*.yaml")) + sorted((EXAMPLES / "workloads").glob("*.yaml"))
CLUSTERS = ("crds", "volcano")
KUBECTL_TIMEOUT = 120.0


@dataclass
class Cluster:
    name: str
    envtest: EnvTest
    admin: kube_client.ApiClient
    kubectl_path: Path
    logs: list[Path]

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        return subprocess.run([str(self.kubectl_path), f"--kubeconfig={self.envtest.kubeconfig()}", *args],
                              capture_output=True, text=True, timeout=KUBECTL_TIMEOUT, env=env)

    def tails(self) -> str:
        """The last lines of each process beside the API server, for a failure's message."""
        out = []
        for log in self.logs:
            if log.exists():
                lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
                out.append(f"--- {log.name}:\n" + "\n".join(lines))
        return "\n".join(out)


def missing(name: str) -> str | None:
    """Why cluster ``name`` cannot run here (None when it can)."""
    reasons = []
    if find_assets() is None:
        reasons.append(f"{ASSETS_ENV} is not set to a directory with kube-apiserver and etcd")
    if crds_dir() is None:
        reasons.append(f"Volcano's CRDs are not in {CRDS_ENV} or ../shared/volcano-crds")
    if name == "volcano" and (whole := volcano_missing()):
        reasons.append(whole)
    return "; ".join(reasons) or None


def our_validation_in_effect(admin: kube_client.ApiClient) -> bool:
    """Whether our /validate answers for Volcano Jobs: a dry-run Job naming a plugin we refuse is refused."""
    probe = yaml.safe_load((EXAMPLES / "jobs" / "env-job.yaml").read_text(encoding="utf-8"))
    probe["metadata"] = {"name": "validate-probe", "namespace": "default",
                         "annotations": {PLUGINS_ANNOTATION: json.dumps({"nonesuch": []})}}
    try:
        create(admin, probe, dry_run=True)
    except ApiException as exc:
        return exc.status == 403 and "nonesuch" in status_message(exc)
    return False


@pytest.fixture(scope="module", params=CLUSTERS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = missing(request.param)
    if reason:
        pytest.skip(reason)
    kubectl = kubectl_or_skip()
    assets = find_assets()
    assert assets is not None
    workdir = tmp_path_factory.mktemp(f"examples-{request.param}")
    with EnvTest(assets, workdir / "apiserver") as envtest:
        envtest.install_prerequisites()  # our webhook's RBAC
        admin = envtest.api_client()
        install_jobset_crd(admin)
        # The namespace's ServiceAccount, which no controller-manager makes here: Volcano's Pods need it.
        apply(admin, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "default"}})
        volcano = workdir / "volcano"
        if request.param == "volcano":
            beside: contextlib.AbstractContextManager[object] = whole_volcano(admin, envtest.kubeconfig(), volcano)
        else:
            install_volcano(admin)  # the CRDs and the Queue default, nothing running
            beside = contextlib.nullcontext()
        with beside, serving_webhook(workdir / "webhook", envtest.kubeconfig(WEBHOOK_USER)) as served:
            configurations = webhook_configurations(served.base_url, served.ca_bundle)
            for obj in configurations:
                apply(admin, obj)
            wait_until(lambda: our_validation_in_effect(admin), 30, "our ValidatingWebhookConfiguration to take effect")
            logs = [served.process.log_path, *(sorted(volcano.glob("*.log")) if volcano.exists() else [])]
            yield Cluster(request.param, envtest, admin, kubectl, logs)


def stored(cluster: Cluster, path: Path) -> dict[str, Any]:
    done = cluster.kubectl("get", "-f", str(path), "-o", "json")
    assert done.returncode == 0, f"kubectl get -f {path.name}: {done.stderr}"
    obj: dict[str, Any] = json.loads(done.stdout)
    return obj


# What a user does, and the word kubectl answers each with.
STEPS = (
    ("apply", ("apply", "-f"), "created"),
    ("apply again", ("apply", "-f"), "unchanged"),  # the file is what is stored, defaults and all
    ("apply --server-side", ("apply", "--server-side", "-f"), "serverside-applied"),
    ("delete", ("delete", "--timeout=60s", "-f"), "deleted"),
    ("apply after delete", ("apply", "-f"), "created"),
)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_example_takes_apply_again_server_side_delete_and_apply(cluster: Cluster, path: Path) -> None:
    uids: list[str] = []
    said: list[str] = []
    try:
        for what, args, word in STEPS:
            done = cluster.kubectl(*args, str(path))
            where = f"[{cluster.name}] {path.parent.name}/{path.name}: {what} (kubectl {' '.join(args)})"
            assert done.returncode == 0, f"{where} failed:\n{done.stderr}\n{cluster.tails()}"
            assert "Warning" not in done.stderr, f"{where}: {done.stderr}"
            said.append(done.stdout.strip())
            # kubectl's line: <kind>/<name> created (unchanged, ...), or <kind> "<name>" deleted from <namespace> namespace
            assert re.search(rf"\b{word}\b", done.stdout), f"{where}: {done.stdout}"
            if what != "delete":
                uids.append(stored(cluster, path)["metadata"]["uid"])
        assert uids[0] == uids[1] == uids[2] != uids[3], f"{path.name}: uids {uids}"
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "--timeout=60s", "-f", str(path))
    print(f"[{cluster.name}] {path.name}: " + " | ".join(said))
