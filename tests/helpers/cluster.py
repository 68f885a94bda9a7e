"""A namespace of a cluster where Volcano's job controller runs, for the scenarios beside Volcano: a
kube-apiserver of the session's own with Volcano's CRDs (``VOLCANO_CRDS`` or ``../shared/volcano-crds``)
and ``vc-controller-manager`` (``VOLCANO_CONTROLLER``). :func:`api_server` gives either API server alone, so a test of the double
holds it to the real one; :func:`whole_volcano` runs Volcano's scheduler and admission too.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.envtest import (
    ASSETS_ENV,
    WEBHOOK_USER,
    EnvTest,
    Process,
    ProductWebhook,
    apply,
    create,
    delete,
    find_assets,
    free_port,
    http_ok,
    https_get,
    install_crds,
    new_namespace,
    read,
    read_path,
    request,
    resource_path,
    serving_webhook,
    start_product,
    status_message,
    wait_until,
    webhook_configurations,
    write_certs,
)
from tests.helpers.jobs import API_VERSION as JOB_API_VERSION
from tests.helpers.jobs import job_owner
from tests.helpers.kustomize import DEFAULT_VARIANT, documents

T = TypeVar("T")
Obj = dict[str, Any]

CONTROLLER_ENV = "VOLCANO_CONTROLLER"
CRDS_ENV = "VOLCANO_CRDS"
ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = ("batch.volcano.sh_jobs.yaml", "bus.volcano.sh_commands.yaml", "scheduling.volcano.sh_podgroups.yaml",
             "scheduling.volcano.sh_queues.yaml")
# What vc-scheduler would create; the job controller refuses to sync a Job whose Queue is missing.
DEFAULT_QUEUE = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "default"},
                 "spec": {"weight": 1, "reclaimable": True}}
# Of the kinds the scenarios touch, those not in the core group.
API_VERSIONS = {"Job": JOB_API_VERSION, "PodGroup": "scheduling.volcano.sh/v1beta1", "Queue": "scheduling.volcano.sh/v1beta1",
                "Command": "bus.volcano.sh/v1alpha1", "NetworkPolicy": "networking.k8s.io/v1"}
WAIT = 30.0  # seconds: generous, since a slow machine must not fail a correct test


def crds_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where Volcano's CRDs are: ``VOLCANO_CRDS``, else ``../shared/volcano-crds``; None if absent."""
    directory = Path(environ[CRDS_ENV]) if environ.get(CRDS_ENV) else ROOT.parent / "shared" / "volcano-crds"
    return directory if all((directory / f).is_file() for f in CRD_FILES) else None


@functools.cache
def volcano_crds(directory: Path) -> tuple[Obj, ...]:
    return tuple(documents((directory / f).read_text(encoding="utf-8"))[0] for f in CRD_FILES)


def scheduler_crds(directory: Path) -> tuple[Obj, ...]:
    """The CRDs vc-scheduler lists and watches besides the job controller's (HyperNode, Numatopology)."""
    return tuple(yaml.safe_load(f.read_text(encoding="utf-8")) for f in sorted((directory / "scheduler").glob("*.yaml")))


def find_controller(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The ``vc-controller-manager`` binary ``VOLCANO_CONTROLLER`` names, if it is executable."""
    value = environ.get(CONTROLLER_ENV)
    if value and os.access(value, os.X_OK) and Path(value).is_file():
        return Path(value)
    return None


def real_missing(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the real backend cannot run here (None when it can)."""
    missing = []
    if find_controller(environ) is None:
        missing.append(f"{CONTROLLER_ENV} is not set to an executable vc-controller-manager")
    if find_assets(environ) is None:
        missing.append(f"{ASSETS_ENV} is not set to a directory with kube-apiserver and etcd")
    if crds_dir(environ) is None:
        missing.append(f"Volcano's CRDs are not in {CRDS_ENV} or ../shared/volcano-crds")
    return "; ".join(missing) or None


def kind_path(api: client.ApiClient, kind: str, namespace: str | None, name: str | None = None,
              subresource: str | None = None) -> str:
    """The REST path of a kind the scenarios touch (Volcano's, or core's), found by discovery."""
    path = resource_path(api, API_VERSIONS.get(kind, "v1"), kind, namespace, name)
    return path + (f"/{subresource}" if subresource else "")


@dataclass
class VolcanoCluster:
    """One test's namespace of a cluster where Volcano's job controller runs. ``user`` is the
    product's, with exactly the manifests' RBAC."""

    admin: client.ApiClient
    user: client.ApiClient
    user_name: str
    namespace: str
    envtest: EnvTest
    controller_log: Callable[[int], str] | None = None
    registered: list[Obj] = field(default_factory=list)

    def kubeconfig(self, workdir: Path) -> Path:
        """A kubeconfig for the product's user (``--kubeconfig`` of a product subprocess)."""
        return self.envtest.kubeconfig(self.user_name)

    # -- webhooks -------------------------------------------------------------------------------

    def register_webhooks(self, base_url: str, ca_bundle: bytes, *, variant: str = DEFAULT_VARIANT,
                          timeout: float = WAIT) -> list[Obj]:
        """Register the webhook configurations the variant's reconciler would, calling ``base_url``
        (tests/helpers/envtest.py's ``webhook_configurations``), and return once the API server calls them: a
        dry-run Pod comes back otherwise than before (a real server takes about a second)."""
        probe = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "webhook-probe", "namespace": self.namespace,
                              "labels": {"volcano.sh/job-name": "webhook-probe"}},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        before = self._dry_run(probe)
        configurations = webhook_configurations(base_url, ca_bundle, variant)
        for obj in configurations:
            apply(self.admin, obj)
        self.registered = configurations
        wait_until(lambda: self._dry_run(probe) != before, timeout, "the MutatingWebhookConfiguration to take effect")
        return configurations

    def unregister_webhooks(self) -> None:
        for obj in self.registered:
            delete(self.admin, obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        self.registered = []

    def _dry_run(self, obj: Obj) -> tuple[str, Any]:
        warnings: list[str] = []
        try:
            stored = create(self.admin, obj, dry_run=True, warnings=warnings)
        except ApiException as exc:
            return "error", status_message(exc)
        for key in ("uid", "creationTimestamp", "resourceVersion", "managedFields"):
            stored["metadata"].pop(key, None)
        # The ServiceAccount admission plugin's token volume has a random name in every answer.
        spec = stored.get("spec") or {}
        spec["volumes"] = [v for v in spec.get("volumes") or [] if not v["name"].startswith("kube-api-access-")]
        for container in spec.get("containers") or []:
            container["volumeMounts"] = [m for m in container.get("volumeMounts") or []
                                         if not m["name"].startswith("kube-api-access-")]
        return "ok", (warnings, stored)

    # -- reading and writing --------------------------------------------------------------------

    def create(self, obj: Mapping[str, Any], *, api: client.ApiClient | None = None, warnings: list[str] | None = None) -> Obj:
        """Create ``obj`` in this namespace (its own namespace is ignored), as ``api`` (the admin)."""
        body = dict(obj)
        body["metadata"] = {**(obj.get("metadata") or {}), "namespace": self.namespace}
        return create(api or self.admin, body, warnings=warnings)

    def get(self, kind: str, name: str) -> Obj | None:
        """One object of this namespace (a Queue: cluster-wide), None when absent."""
        return read_path(self.admin, kind_path(self.admin, kind, self.namespace, name))

    def list(self, kind: str, selector: str | None = None) -> list[Obj]:
        items: list[Obj] = request(self.admin, "GET", kind_path(self.admin, kind, self.namespace),
                                   query=[("labelSelector", selector)] if selector else [])["items"]
        return items

    def pods(self, job: str) -> list[Obj]:
        """The Job's Pods, by name."""
        return sorted(self.list("Pod", f"volcano.sh/job-name={job}"), key=lambda p: p["metadata"]["name"])

    def podgroup(self, job: str) -> Obj | None:
        """The Job's PodGroup (``<job>-<uid>``), None while there is none."""
        stored = self.get("Job", job)
        return self.get("PodGroup", f"{job}-{stored['metadata']['uid']}") if stored else None

    def phase(self, job: str) -> str:
        """The Job's ``status.state.phase`` ("" before Volcano wrote one, or when there is no Job)."""
        stored = self.get("Job", job) or {}
        return str(((stored.get("status") or {}).get("state") or {}).get("phase") or "")

    def events(self, job: str) -> list[Obj]:
        """The Events about the Job, oldest first (what ``kubectl describe`` shows)."""
        events = [e for e in self.list("Event") if (e.get("involvedObject") or {}).get("name") == job
                  and (e.get("involvedObject") or {}).get("kind") == "Job"]
        return sorted(events, key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["name"]))

    def wait(self, predicate: Callable[[], T], what: str, timeout: float = WAIT) -> T:
        """``predicate()``'s first truthy value; AssertionError naming ``what`` (and the controller's
        log tail) after ``timeout`` seconds."""
        controller_log = self.controller_log
        return wait_until(predicate, timeout, what, interval=0.02, log=(lambda: controller_log(40)) if controller_log else None)

    def settle(self) -> None:
        """Before checking that something did *not* happen: the controller has had a second (never
        used to wait for something that should happen: use :meth:`wait`)."""
        time.sleep(1.0)

    # -- what vc-scheduler and vcctl would do -------------------------------------------------------

    def inqueue(self, job: str, phase: str = "Inqueue", timeout: float = WAIT) -> Obj:
        """Set the Job's PodGroup to ``phase`` (vc-scheduler's enqueue action), once the controller
        has made it. Returns the PodGroup."""
        podgroup = self.wait(lambda: self.podgroup(job), f"the PodGroup of Job {job}", timeout)
        return self._set_phase("PodGroup", podgroup["metadata"]["name"], phase)

    def restart(self, job: str, action: str = "RestartJob") -> Obj:
        """What ``vcctl job restart`` creates: a Command whose target and controller are the Job."""
        stored = self.get("Job", job)
        assert stored is not None, f"no Job {job} to {action}"
        ref = job_owner(stored)
        command = {"apiVersion": API_VERSIONS["Command"], "kind": "Command",
                   "metadata": {"generateName": f"{job}-{action.lower()}-", "namespace": self.namespace,
                                "ownerReferences": [ref]},
                   "target": ref, "action": action}
        return create(self.admin, command)

    def set_pod_phase(self, name: str, phase: str) -> Obj:
        """Write a Pod's ``status.phase`` through the status subresource, as a kubelet would."""
        return self._set_phase("Pod", name, phase, "status")

    def _set_phase(self, kind: str, name: str, phase: str, subresource: str | None = None) -> Obj:
        patched: Obj = request(self.admin, "PATCH", kind_path(self.admin, kind, self.namespace, name, subresource),
                               body={"status": {"phase": phase}}, content_type="application/merge-patch+json")
        return patched

    def finish(self, job: str, phase: str = "Succeeded") -> list[Obj]:
        """Every Pod of the Job to ``phase``."""
        return [self.set_pod_phase(p["metadata"]["name"], phase) for p in self.pods(job)]


# Either API server alone -------------------------------------------------------------------------

SERVERS = ("double", "real")


@dataclass
class ServerNamespace:
    """A fresh namespace of an API server, as its administrator; ``double`` is the double, None on
    the real kube-apiserver."""

    backend: str  # "double" or "real"
    admin: client.ApiClient
    namespace: str
    double: FakeApiServer | None = None


@contextmanager
def api_server(backend: str, request: pytest.FixtureRequest) -> Iterator[ServerNamespace]:
    """A namespace of a fresh double ("double"), or of the session's kube-apiserver ("real": fixture
    ``envtest``, which skips naming what is missing), made the same way on both."""
    if backend == "real":
        envtest: EnvTest = request.getfixturevalue("envtest")
        admin = envtest.api_client()
        yield ServerNamespace("real", admin, new_namespace(admin))
        return
    with FakeApiServer() as double, double.api_client() as admin:
        yield ServerNamespace("double", admin, new_namespace(admin), double)


# Volcano on the real API server ------------------------------------------------------------


def install_volcano(api: client.ApiClient, timeout: float = WAIT, *, scheduler: bool = False) -> None:
    """Volcano's CRDs (from :func:`crds_dir`) and the Queue ``default``, once the CRDs are served.
    ``scheduler``: also the two CRDs vc-scheduler lists (``scheduler/``) and no Queue (vc-scheduler
    makes ``root`` and ``default``)."""
    directory = crds_dir()
    if directory is None:
        raise FileNotFoundError(f"Volcano's CRDs are not in {CRDS_ENV} or ../shared/volcano-crds")
    install_crds(api, volcano_crds(directory) + (scheduler_crds(directory) if scheduler else ()), timeout)
    if scheduler:
        return
    apply(api, DEFAULT_QUEUE)


@dataclass
class RealVolcano:
    """kube-apiserver, etcd and vc-controller-manager for a session."""

    assets: Path
    binary: Path
    workdir: Path
    envtest: EnvTest | None = None
    process: Process | None = None

    def start(self, timeout: float = 60.0) -> RealVolcano:
        self.envtest = EnvTest(self.assets, self.workdir / "apiserver").start()
        self.envtest.install_prerequisites()
        install_volcano(self.envtest.api_client())
        # The controller runs as the administrator (real-kubernetes.md: a system:masters token).
        self.process = start_controller(self.binary, self.envtest.kubeconfig(), self.workdir / "vc-controller-manager.log",
                                        timeout)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5.0)
            self.process = None
        if self.envtest is not None:
            self.envtest.stop()
            self.envtest = None

    def cluster(self) -> VolcanoCluster:
        """A fresh namespace of this cluster."""
        assert self.envtest is not None and self.process is not None
        admin = self.envtest.api_client()
        process = self.process
        return VolcanoCluster(admin, self.envtest.api_client(WEBHOOK_USER), WEBHOOK_USER,
                              new_namespace(admin, "volcano-"), envtest=self.envtest,
                              controller_log=lambda tail: f"vc-controller-manager:\n{process.log(tail=tail)}")


def start_controller(binary: Path, kubeconfig: Path, log_path: Path, timeout: float = 60.0,
                     controllers: str = "job-controller,pg-controller") -> Process:
    """Volcano's job and PodGroup controllers (``vc-controller-manager``) through ``kubeconfig``
    (Volcano's CRDs and Queue installed first: :func:`install_volcano`), once it says
    ``JobController is running``; stopped by the caller."""
    process = Process.start("vc-controller-manager", [
        str(binary), f"--kubeconfig={kubeconfig}", "--leader-elect=false", f"--controllers={controllers}",
    ], log_path)
    try:
        process.wait_for(lambda: "JobController is running" in process.log(), timeout,
                         "vc-controller-manager's 'JobController is running'")
    except BaseException:
        process.stop()
        raise
    return process


# A whole Volcano: scheduler, controllers and admission (real-kubernetes.md, "A whole Volcano") ---

SCHEDULER_ENV, ADMISSION_ENV = "VOLCANO_SCHEDULER", "VOLCANO_ADMISSION"
# Gang scheduling as Volcano's chart configures it, less the plugins that need a metrics server.
SCHEDULER_CONF = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins: [{name: priority}, {name: gang}, {name: conformance}]
- plugins: [{name: overcommit}, {name: drf}, {name: predicates}, {name: proportion}, {name: nodeorder}]
"""

# What Volcano's chart registers for vc-webhook-manager (templates/webhooks.yaml at ed72c7c), which
# then fills in each caBundle: (configuration kind, resource, verb, group, version, operations).
ADMISSIONS = (
    ("MutatingWebhookConfiguration", "pods", "mutate", "", "v1", ["CREATE"]),
    ("MutatingWebhookConfiguration", "queues", "mutate", "scheduling.volcano.sh", "v1beta1", ["CREATE"]),
    ("MutatingWebhookConfiguration", "podgroups", "mutate", "scheduling.volcano.sh", "v1beta1", ["CREATE"]),
    ("MutatingWebhookConfiguration", "jobs", "mutate", "batch.volcano.sh", "v1alpha1", ["CREATE"]),
    ("ValidatingWebhookConfiguration", "jobs", "validate", "batch.volcano.sh", "v1alpha1", ["CREATE", "UPDATE"]),
    ("ValidatingWebhookConfiguration", "pods", "validate", "", "v1", ["CREATE"]),
    ("ValidatingWebhookConfiguration", "queues", "validate", "scheduling.volcano.sh", "v1beta1", ["CREATE", "UPDATE", "DELETE"]),
)


def volcano_admissions(url: str) -> list[Obj]:
    """Volcano's chart's webhook configurations, each calling ``url`` + its path (its Service here)."""
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
             "metadata": {"name": f"volcano-admission-service-{resource}-{verb}"},
             "webhooks": [{
                 "name": f"{verb}{resource[:-1]}.volcano.sh", "admissionReviewVersions": ["v1"],
                 "clientConfig": {"url": f"{url}/{resource}/{verb}"}, "failurePolicy": "Fail", "matchPolicy": "Equivalent",
                 "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                             "values": ["volcano-system", "kube-system"]}]},
                 "rules": [{"apiGroups": [group], "apiVersions": [version], "operations": operations,
                            "resources": [resource], "scope": "*"}],
                 "sideEffects": "NoneOnDryRun", "timeoutSeconds": 10,
                 **({"reinvocationPolicy": "Never"} if verb == "mutate" else {})}]}
            for kind, resource, verb, group, version, operations in ADMISSIONS]


def volcano_missing(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why a whole Volcano cannot run here (None when it can): its three binaries and its CRDs."""
    missing = [f"{name} is not set to an executable {what}"
               for name, what in ((CONTROLLER_ENV, "vc-controller-manager"), (SCHEDULER_ENV, "vc-scheduler"),
                                  (ADMISSION_ENV, "vc-webhook-manager"))
               if not (environ.get(name) and os.access(environ[name], os.X_OK))]
    directory = crds_dir(environ)
    if directory is None or not scheduler_crds(directory):
        missing.append(f"Volcano's CRDs (with scheduler/) are not in {CRDS_ENV} or ../shared/volcano-crds")
    return "; ".join(missing) or None


@contextmanager
def whole_volcano(api: client.ApiClient, kubeconfig: Path, workdir: Path,
                  environ: Mapping[str, str] = os.environ) -> Iterator[dict[str, Process]]:
    """Volcano as its chart runs it, through ``kubeconfig`` (a ``system:masters`` user): its CRDs,
    ``vc-scheduler``, the job, PodGroup and queue controllers, and ``vc-webhook-manager`` on loopback,
    registered as the chart registers it (it refuses plugin names Volcano does not know in
    spec.plugins: why ours go in the job annotation). Yields the processes by name; on exit stops them
    and takes the registrations away."""
    install_volcano(api, scheduler=True)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "scheduler.conf").write_text(SCHEDULER_CONF)
    write_certs(workdir, ca_name="volcano-admission-ca")
    port = free_port()
    processes: dict[str, Process] = {}
    try:
        processes["vc-scheduler"] = scheduler = Process.start("vc-scheduler", [
            environ[SCHEDULER_ENV], f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            f"--scheduler-conf={workdir / 'scheduler.conf'}", f"--listen-address=127.0.0.1:{free_port()}"],
            workdir / "vc-scheduler.log")
        scheduler.wait_for(lambda: read(api, API_VERSIONS["Queue"], "Queue", "default"), WAIT, "vc-scheduler to make the Queue default")
        # The queue controller too: Volcano's admission takes Jobs only into an Open Queue.
        processes["vc-controller-manager"] = start_controller(
            Path(environ[CONTROLLER_ENV]), kubeconfig, workdir / "vc-controller-manager.log",
            controllers="job-controller,pg-controller,queue-controller")
        wait_until(lambda: ((read(api, API_VERSIONS["Queue"], "Queue", "default") or {}).get("status") or {}).get("state") == "Open",
                   WAIT, "the Queue default Open")
        processes["vc-webhook-manager"] = admission = Process.start("vc-webhook-manager", [
            environ[ADMISSION_ENV], f"--kubeconfig={kubeconfig}", "--listen-address=127.0.0.1", f"--port={port}",
            f"--tls-cert-file={workdir / 'tls.crt'}", f"--tls-private-key-file={workdir / 'tls.key'}",
            f"--ca-cert-file={workdir / 'ca.crt'}", f"--webhook-url=https://127.0.0.1:{port}"],
            workdir / "vc-webhook-manager.log")

        configurations = volcano_admissions(f"https://127.0.0.1:{port}")
        for obj in configurations:
            apply(api, obj)

        def patched() -> bool:
            return all((read(api, o["apiVersion"], o["kind"], o["metadata"]["name"]) or {}).get("webhooks", [{}])[0]
                       .get("clientConfig", {}).get("caBundle") for o in configurations)

        admission.wait_for(patched, WAIT, "vc-webhook-manager to fill in its caBundles")
        time.sleep(1.0)  # a new registration takes about a second to take effect (real-kubernetes.md)
        yield processes
    finally:
        for obj in volcano_admissions(""):  # no Pod is refused by an admission that is gone
            delete(api, obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        for process in reversed(processes.values()):
            process.stop(grace=3.0)


def product_webhook(cluster: VolcanoCluster, workdir: Path, *args: str, timeout: float = WAIT,
                    kubeconfig: Path | None = None) -> AbstractContextManager[ProductWebhook]:
    """:func:`tests.helpers.envtest.serving_webhook` as the cluster's product user. Register it with
    ``cluster.register_webhooks(w.base_url, w.ca_bundle)``. ``kubeconfig``: another way to the API
    server (:func:`through`) than ``cluster.kubeconfig``."""
    return serving_webhook(workdir, kubeconfig or cluster.kubeconfig(workdir), *args, timeout=timeout)


def names(objects: Sequence[Obj]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


def metrics(url: str) -> dict[str, float]:
    """Every sample of the ``/metrics`` at ``url`` (HTTP, or HTTPS unchecked), by name and labels as
    Prometheus writes them."""
    answer = https_get(f"{url}/metrics", timeout=5)
    assert answer is not None and answer[0] == 200, f"{url}/metrics: {answer}"
    return {name: float(value) for line in answer[1].decode().splitlines() if line and not line.startswith("#")
            for name, _, value in [line.rpartition(" ")]}


def total(url: str, prefix: str) -> float:
    """The sum of the samples at ``url``'s /metrics whose name and labels start with ``prefix``."""
    return sum(v for k, v in metrics(url).items() if k.startswith(prefix))


@dataclass
class ProductReconciler:
    """The product's reconciler, running: its health port, and its metrics as numbers."""

    process: Process
    health: str

    def metrics(self) -> dict[str, float]:
        return metrics(self.health)

    def total(self, prefix: str) -> float:
        return total(self.health, prefix)


@contextmanager
def product_reconciler(kubeconfig: Path, namespace: str, workdir: Path, *args: str,
                       timeout: float = WAIT) -> Iterator[ProductReconciler]:
    """``volcano-webhook reconcile`` (plus ``args``) through ``kubeconfig``, watching ``namespace``,
    once ``/readyz`` says its caches are synced; stopped at the end."""
    port = free_port()
    process = start_product(["reconcile", f"--kubeconfig={kubeconfig}", f"--namespace={namespace}", f"--health-port={port}", "--log-level=debug", *args],
                            workdir / "reconcile.log")
    health = f"http://127.0.0.1:{port}"
    try:
        process.wait_for(lambda: http_ok(f"{health}/readyz"), timeout, "the reconciler's /readyz (caches synced)")
        yield ProductReconciler(process, health)
    finally:
        process.stop()


def through(kubeconfig: Path, port: int, workdir: Path) -> Path:
    """A copy of ``kubeconfig`` whose server is 127.0.0.1:``port`` (a :class:`tests.helpers.servers.TcpProxy`)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        scheme = entry["cluster"]["server"].split("://")[0]
        entry["cluster"]["server"] = f"{scheme}://127.0.0.1:{port}"
    out = workdir / f"through-{port}.kubeconfig"
    out.write_text(yaml.safe_dump(config))
    return out


def server_address(kubeconfig: Path) -> tuple[str, int]:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, _, port = server.split("://")[1].rstrip("/").rpartition(":")
    return host, int(port)
