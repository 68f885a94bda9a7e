"""The one-node cluster the tests in this folder share: real parts (tests/helpers/node.py), cluster DNS
(CoreDNS), a whole Volcano (tests/helpers/cluster.py's ``whole_volcano``: scheduler, controllers, admission),
the product's image and the jobs' image in the node's containerd. Brought up once for this folder
(about a minute) and torn down after its last test, since a machine holds one node; each test
installs and uninstalls the product itself, with the helpers below (the chart's install, the webhook
registrations, a stream of Pods created while something happens).

Skips, naming what is missing, without root, the node's parts (``KUBEBUILDER_ASSETS``,
``KUBE_NODE_ASSETS``, Debian's containerd, runc, CNI plugins, iptables...), Volcano's three binaries
(``VOLCANO_CONTROLLER``, ``VOLCANO_SCHEDULER``, ``VOLCANO_ADMISSION``) and CRDs, CoreDNS (``COREDNS``),
helm, kubectl, or buildah and a base image (tests/programs/test_image.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers import node as node_module
from tests.helpers.cluster import VolcanoCluster, volcano_missing, whole_volcano
from tests.helpers.envtest import ADMIN, Process, create, read, status_message, wait_until
from tests.helpers.helm import helm_or_skip
from tests.helpers.jobs import job_owner, volcano_job
from tests.helpers.kustomize import kubectl_or_skip
from tests.helpers.node import Node
from tests.programs.test_image import CACHE, TAG, Image, base_or_skip, build_image, buildah
from volcano_job_webhook.plugins import Job
from volcano_job_webhook.plugins.podgen import make_pod

COREDNS_ENV = "COREDNS"
# Debian's Python 3.11 (the base) with what the jobs run besides Python: Open MPI and OpenSSH for
# mpirun over ssh, netcat for the wait for the master, GNU OpenMP for Paddle's CPU build, pdsh for
# DeepSpeed's own launcher. The frameworks come from the host. Tagged by its package list, so a
# changed list builds anew.
JOBS_PACKAGES = ("openmpi-bin", "openssh-server", "openssh-client", "netcat-openbsd", "libgomp1", "pdsh")
JOBS_IMAGE = f"localhost/vjw-jobs:{hashlib.sha256(' '.join(JOBS_PACKAGES).encode()).hexdigest()[:12]}"


@dataclass
class Figures:
    """What a module measures, printed and written to JSON at the end."""

    values: dict[str, Any] = field(default_factory=dict)

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = round(value, 2) if isinstance(value, float) else value


def figures_fixture(name: str, title: str) -> Callable[..., Iterator[Figures]]:
    """A module's ``figures`` fixture: written to ``NAME.json`` and printed (with ``-s``) at its end."""

    @pytest.fixture(scope="module")
    def figures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Figures]:
        out = Figures()
        yield out
        if out.values:
            path = tmp_path_factory.mktemp("figures") / f"{name}.json"
            path.write_text(json.dumps(out.values, indent=1))
            print(f"\n{title} ({path}):\n" + "\n".join(f"  {k}: {v}" for k, v in out.values.items()))

    return figures


@dataclass
class Cluster:
    node: Node
    admin: client.ApiClient
    volcano_processes: dict[str, Process]
    timings: dict[str, float]

    def kubectl(self, *args: str, timeout: float = 120) -> str:
        return node_module.run(kubectl_or_skip(), *args, env=self.node.tool_env(), timeout=timeout).stdout

    def helm(self, *args: str, timeout: float = 120) -> str:
        return node_module.run(helm_or_skip(), *args, env=self.node.tool_env(), timeout=timeout).stdout

    def volcano(self, namespace: str) -> VolcanoCluster:
        """tests/helpers/cluster.py's view of a namespace here (create, pods, phase...)."""
        return VolcanoCluster(self.admin, self.admin, ADMIN, namespace, envtest=self.node.envtest,
                              controller_log=self.volcano_logs)

    def volcano_logs(self, tail: int = 30) -> str:
        return "\n".join(f"--- {name}:\n{p.log(tail=tail)}" for name, p in self.volcano_processes.items())

    def namespace(self, prefix: str) -> str:
        """A new namespace, once kube-controller-manager has made its ``default`` ServiceAccount."""
        made = create(self.admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"generateName": prefix}})
        name: str = made["metadata"]["name"]
        wait_until(lambda: read(self.admin, "v1", "ServiceAccount", "default", name), 30, f"ServiceAccount {name}/default")
        return name


def requirements_or_skip() -> None:
    """Skip before anything is built or started when a part is missing (a node a killed test run
    left behind is erased first: its chains would read as another node's)."""
    if os.geteuid() == 0:
        node_module.clean_stale()
    reasons = [node_module.missing(), volcano_missing()]
    if not (os.environ.get(COREDNS_ENV) and os.access(os.environ[COREDNS_ENV], os.X_OK)):
        reasons.append(f"{COREDNS_ENV} is not set to an executable coredns")
    reason = "; ".join(r for r in reasons if r)
    if reason:
        pytest.skip(reason)
    helm_or_skip()
    kubectl_or_skip()


def jobs_image(base: str) -> str:
    """:data:`JOBS_IMAGE` in buildah's storage: there already, else from its archive in the cache,
    else built on ``base`` with Debian's packages (a few minutes, once a machine)."""
    archive = CACHE / f"vjw-jobs-{JOBS_IMAGE.rpartition(':')[2]}.oci.tar"
    if buildah("inspect", "--type", "image", JOBS_IMAGE).returncode == 0:
        return JOBS_IMAGE
    if archive.exists():
        loaded = buildah("pull", "-q", f"oci-archive:{archive}", timeout=300)
        if loaded.returncode == 0 and buildah("tag", loaded.stdout.split()[-1], JOBS_IMAGE).returncode == 0:
            return JOBS_IMAGE
    container = buildah("from", "--pull=never", base).stdout.strip()
    try:
        done = buildah("run", "--isolation", "chroot", container, "--", "sh", "-c",
                       "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
                       f"{' '.join(JOBS_PACKAGES)} && rm -rf /var/lib/apt/lists/*", timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert buildah("commit", "-q", container, JOBS_IMAGE, timeout=300).returncode == 0
    finally:
        buildah("rm", container)
    CACHE.mkdir(parents=True, exist_ok=True)
    buildah("push", "-q", JOBS_IMAGE, f"oci-archive:{archive}.partial", timeout=300)
    Path(f"{archive}.partial").replace(archive)
    return JOBS_IMAGE


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The node with cluster DNS and a whole Volcano, the product's and the jobs' images imported."""
    requirements_or_skip()
    built: Image = build_image()
    workdir = tmp_path_factory.mktemp("node")
    timings: dict[str, float] = {"image_build_s": built.build_seconds}
    started = time.monotonic()
    images = {TAG: workdir / "product.oci.tar", jobs_image(base_or_skip()): workdir / "jobs.oci.tar"}
    for reference, archive in images.items():
        # Uncompressed: the archive only crosses this machine's disk.
        node_module.run("buildah", "push", "--disable-compression", reference, f"oci-archive:{archive}:{reference}", timeout=300)
    timings["images_s"] = time.monotonic() - started
    assets, node_assets = node_module.find_assets(), node_module.find_node_assets()
    assert assets is not None and node_assets is not None
    node = Node(assets, node_assets, workdir, coredns=Path(os.environ[COREDNS_ENV]))
    with node:
        timings["node_bring_up_s"] = node.timings["bring_up"]
        for reference, archive in images.items():
            node.import_image(archive, base_name=reference.rpartition(":")[0])
        admin = node.api_client()
        started = time.monotonic()
        with whole_volcano(admin, node.kubeconfig(), workdir / "volcano") as processes:
            timings["volcano_up_s"] = time.monotonic() - started
            yield Cluster(node, admin, processes, timings)
    assert not node.leftovers(), f"left on this machine: {node.leftovers()}"


# The product's install, shared by the modules ----------------------------------------------------------

NAMESPACE = "volcano-job-webhook"  # the release's, as docs/install.md installs it
RELEASE = "volcano-job-webhook"
DEPLOYMENT = "volcano-job-webhook"
CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
REPOSITORY, _, IMAGE_TAG = TAG.rpartition(":")
WIRED = "VC_TASK_INDEX"  # what the job annotation asks of the webhook (env)
POD_INTERVAL = 0.2  # seconds between Pod creations: 5 a second
IMAGE_VALUES = [f"--set=image.repository={REPOSITORY}", f"--set=image.tag={IMAGE_TAG}", "--set=image.pullPolicy=Never"]


def wait_installed(cluster: Cluster, *deployments: str) -> None:
    """Each Deployment Available with every replica updated, and the webhooks registered (replaced
    webhook Pods may still be draining: up to 90 s, until the API server closes the connections it
    keeps to them, docs/install.md)."""
    def settled() -> bool:
        return all(deployment_available(cluster, d) for d in deployments) and None not in registrations(cluster).values()

    wait_until(settled, 180, f"{', '.join(deployments)} Available, the webhooks registered",
               interval=0.2, log=lambda: cluster.kubectl("-n", NAMESPACE, "get", "all,events") + cluster.node.logs())


def install(cluster: Cluster, chart: Path, *values: str) -> None:
    # An install an earlier module took away may still be terminating its namespace.
    wait_until(lambda: not read(cluster.admin, "v1", "Namespace", NAMESPACE), 180, f"namespace {NAMESPACE} gone", interval=0.5)
    cluster.helm("install", RELEASE, str(chart), "-n", NAMESPACE, "--create-namespace", *IMAGE_VALUES, *values)
    wait_installed(cluster, DEPLOYMENT)


def uninstall(cluster: Cluster) -> None:
    """helm uninstall and the namespace deleted, until both are gone with the registrations (the next
    test installs the same release in the same namespace)."""
    try:
        cluster.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s", timeout=150)
    finally:
        unregistered(cluster)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")
        wait_until(lambda: not read(cluster.admin, "v1", "Namespace", NAMESPACE), 180, f"namespace {NAMESPACE} deleted", interval=0.5)


def cut_drains_short(cluster: Cluster, *selector: str) -> None:
    """The release's Pods (``selector``: kubectl's, default all) removed at once, once nothing creates a
    Pod the webhook would be asked about: their drain would wait up to 90 s for the API server to close
    connections it no longer uses, and the kubelet does not shorten the grace of a Pod it is already
    stopping (so ``--force``)."""
    cluster.kubectl("-n", NAMESPACE, "delete", "pods", *(selector or ["--all"]), "--force", "--grace-period=0", "--wait=false", "--ignore-not-found")


def unregistered(cluster: Cluster) -> None:
    """The webhook registrations gone (the garbage collector's, with their owner), then the release's
    Pods removed at once (:func:`cut_drains_short`): nothing calls the webhook any more."""
    wait_until(lambda: set(registrations(cluster).values()) == {None}, 60, "the webhook registrations deleted", interval=0.5)
    cut_drains_short(cluster)


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
            self._stop.wait(max(0.0, self.started + i * POD_INTERVAL - time.monotonic()))

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


