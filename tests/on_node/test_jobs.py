"""Real jobs on a whole Volcano (issue #33): the example jobs of ``examples/jobs/`` run as a user runs
them, on the one-node cluster of tests/on_node/conftest.py (vc-scheduler gang-schedules, Volcano's
admission checks each Job, CoreDNS resolves the Pods' names), with the product installed by its chart
in the README's order.

Each job is submitted unchanged but for three things (:func:`runnable`): its image (the jobs' image:
Debian's Python 3.11 with the conftest's ``JOBS_PACKAGES``), a short program where the example's needs
a download or a file the example does not ship, and no CPU or memory requests or limits (the node has two CPUs;
a GPU count stays, and the node advertises GPUs it does not have, as the plugins only count them). The
frameworks come from the host, not from an image per framework: the test's own virtualenv and the
interpreter it was made from are mounted read-only at the same paths (hostPath), first on ``PATH``,
so ``torchrun``, ``ray`` and ``python`` in a Pod are the ones this test process has. A framework
whose extra is not installed here is skipped, naming the extra.

Every job reaches ``Completed`` (or, for Ray, whose Pods serve until deleted, its driver's answer)
within a bound; on failure the message carries every Pod's logs, the namespace's events and the
wired Pod spec. Then the same with one task's Pods starting 30 s after the others (an init container
that sleeps: an image pull, a busy node), and the cost of the webhook to a job (:func:`test_cost`).
The figures are written to ``real-jobs.json`` and printed with ``-s``; docs/benchmarks.md ("Real jobs
on a whole Volcano") records a run.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.cluster import VolcanoCluster
from tests.helpers.envtest import wait_until
from tests.helpers.helm import CHART
from tests.helpers.node import NODE_NAME, PAUSE_IMAGE
from tests.helpers.paths import EXAMPLES
from tests.on_node.conftest import JOBS_IMAGE, RELEASE, Cluster, Figures, figures_fixture, install, registrations, uninstall
from volcano_job_webhook.plugins.builtin.pytorch import DEFAULT_WAIT_IMAGE

Obj = dict[str, Any]
HOST_PYTHON = tuple(dict.fromkeys((sys.base_prefix, sys.prefix)))  # the interpreter's tree and the virtualenv
PATH = f"{sys.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LATE_SECONDS = 30
DONE = ("Completed", "Failed", "Aborted", "Terminated")

figures = figures_fixture("real-jobs", "Real jobs on a whole Volcano")


def needs(extra: str, module: str | None = None) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module or extra) is None,
                              reason=f"needs the {extra} extra (pip install -e '.[{extra}]')")


# The install ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Cluster]:
    """The chart installed as the README says, until a replica serves and the webhooks are registered
    (the conftest's install); uninstalled at the end. waitfor's image, busybox, is the node's."""
    cluster.node.ctr("images", "tag", "--force", PAUSE_IMAGE, f"docker.io/library/{DEFAULT_WAIT_IMAGE}")
    install(cluster, CHART)
    time.sleep(1.0)  # a new registration takes about a second to take effect
    yield cluster
    uninstall(cluster)


# A job as a user runs it -----------------------------------------------------------------------------


def runnable(example: str, programs: Mapping[str, Sequence[str]] = {}, *, late: str | None = None,
             job: Obj | None = None) -> Obj:
    """``examples/jobs/<example>-job.yaml`` as it runs here: every container on the jobs' image
    with the host's Python first on PATH, no CPU or memory requests or limits, the command of ``programs[task]``
    where given; ``late``: that task's Pods start :data:`LATE_SECONDS` later."""
    job = copy.deepcopy(job) if job is not None else yaml.safe_load((EXAMPLES / "jobs" / f"{example}-job.yaml").read_text())
    job["metadata"].pop("uid", None)
    job["metadata"].pop("namespace", None)
    pytorch = (job["spec"].get("plugins") or {}).get("pytorch") or []
    if "--wait-master-enabled" in pytorch:  # the wait container's image too (busybox's has `nc -z`)
        pytorch.append(f"--wait-master-image={JOBS_IMAGE}")
    for task in job["spec"]["tasks"]:
        spec = task["template"]["spec"]
        spec.setdefault("volumes", []).extend(
            {"name": f"host-python-{i}", "hostPath": {"path": p, "type": "Directory"}} for i, p in enumerate(HOST_PYTHON))
        for container in spec["containers"]:
            container.update(image=JOBS_IMAGE, imagePullPolicy="Never")
            limits = (container.pop("resources", None) or {}).get("limits") or {}
            if extended := {k: v for k, v in limits.items() if k not in ("cpu", "memory")}:
                container["resources"] = {"limits": extended}  # a GPU count: the node advertises some (advertised())
            container.setdefault("env", []).append({"name": "PATH", "value": PATH})
            container.setdefault("volumeMounts", []).extend(
                {"name": f"host-python-{i}", "mountPath": p, "readOnly": True} for i, p in enumerate(HOST_PYTHON))
            if task["name"] in programs:
                container["command"] = list(programs[task["name"]])
        if task["name"] == late:
            spec.setdefault("initContainers", []).insert(0, {
                "name": "starts-late", "image": JOBS_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", str(LATE_SECONDS)]})
    return job


def diagnostics(cluster: Cluster, volcano: VolcanoCluster, name: str) -> str:
    """Every Pod's logs (each container, init containers too), the namespace's events, a wired Pod."""
    ns = volcano.namespace
    parts = [f"Job {name}: {yaml.safe_dump((volcano.get('Job', name) or {}).get('status'))}"]
    pods = volcano.pods(name)
    for pod in pods:
        spec = pod["spec"]
        for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
            try:
                log = cluster.kubectl("-n", ns, "logs", pod["metadata"]["name"], "-c", container["name"], "--tail=40")
            except AssertionError as exc:
                log = str(exc)[-500:]
            parts.append(f"--- {pod['metadata']['name']}/{container['name']} ({(pod.get('status') or {}).get('phase')}):\n{log}")
    parts.append("--- events:\n" + cluster.kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp"))
    if pods:
        parts.append("--- the wired Pod spec of " + pods[0]["metadata"]["name"] + ":\n" + yaml.safe_dump(pods[0]["spec"]))
    parts.append(cluster.volcano_logs(tail=20))
    return "\n".join(parts)


def submit(cluster: Cluster, job: Obj, files: Mapping[str, Path] = {}) -> tuple[VolcanoCluster, float]:
    """Create ``job`` (and a ConfigMap per ``files`` entry, as its comment tells the user) in a new
    namespace; returns the namespace's view and the moment of creation."""
    volcano = cluster.volcano(cluster.namespace(job["metadata"]["name"] + "-"))
    for configmap, path in files.items():
        volcano.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap},
                        "data": {path.name: path.read_text()}})
    started = time.monotonic()
    volcano.create(job)
    return volcano, started


def wait_phase(cluster: Cluster, volcano: VolcanoCluster, job: Obj, started: float, until: str = "Completed",
               timeout: float = 240) -> dict[str, float]:
    """Wait for the Job's phase ``until``; the seconds from ``started`` to all Pods Running and to it.
    A job that ends otherwise, or not in time, fails with :func:`diagnostics`."""
    name, times = job["metadata"]["name"], {}
    expected = sum(t["replicas"] for t in job["spec"]["tasks"])

    def reached() -> str:
        if "running" not in times:
            pods = volcano.pods(name)
            if len(pods) >= expected and all((p.get("status") or {}).get("phase") in ("Running", "Succeeded") for p in pods):
                times["running"] = time.monotonic() - started
        phase = volcano.phase(name)
        return phase if phase in (until, *DONE) else ""

    try:
        phase = wait_until(reached, timeout, f"Job {name} to reach {until}", interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(cluster, volcano, name)}") from None
    assert phase == until, f"Job {name} ended {phase}\n{diagnostics(cluster, volcano, name)}"
    times["done"] = time.monotonic() - started
    return times


def run_job(cluster: Cluster, job: Obj, *, files: Mapping[str, Path] = {}, until: str = "Completed",
            timeout: float = 240) -> tuple[VolcanoCluster, dict[str, float]]:
    """:func:`submit`, then :func:`wait_phase`."""
    volcano, started = submit(cluster, job, files)
    return volcano, wait_phase(cluster, volcano, job, started, until, timeout)


def run_with_a_late_task(cluster: Cluster, example: str, programs: Mapping[str, Sequence[str]], late: str,
                         figures: Figures, files: Mapping[str, Path] = {}) -> list[VolcanoCluster]:
    """The example twice at once, in two namespaces: as it is, and with task ``late`` starting
    :data:`LATE_SECONDS` later; both must complete. Returns the two namespaces' views."""
    jobs = {"together": runnable(example, programs), f"{late}_late": runnable(example, programs, late=late)}
    submitted = {key: (job, *submit(cluster, job, files)) for key, job in jobs.items()}
    views = []
    for key, (job, volcano, started) in submitted.items():
        record(figures, f"{example}_{key}", wait_phase(cluster, volcano, job, started))
        views.append(volcano)
    return views


def logs(cluster: Cluster, volcano: VolcanoCluster, pod: str) -> str:
    """The Pod's main container's output so far ("" while it has none to show)."""
    try:
        return cluster.kubectl("-n", volcano.namespace, "logs", pod)
    except AssertionError:
        return ""


def record(figures: Figures, key: str, times: Mapping[str, float]) -> None:
    for what, seconds in times.items():
        figures[f"{key}_{what}_s"] = seconds


# The workers run the examples' own command: mkdir -p /run/sshd && exec /usr/sbin/sshd -D.
MPI_PROGRAMS = {"mpimaster": ["/bin/sh", "-c", "mpiexec --allow-run-as-root --host ${MPI_HOST} -np 2 hostname"]}


# What it costs a job ----------------------------------------------------------------------------------

COST_RUNS = 5


def admission_seconds(cluster: Cluster) -> tuple[float, float]:
    """The API server's own count and sum of seconds for calls to our webhook."""
    text = cluster.kubectl("get", "--raw", "/metrics")
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds_") and f'{RELEASE}.io"' in line:
            value = float(line.rsplit(" ", 1)[1])
            if "_count{" in line:
                count += value
            elif "_sum{" in line:
                total += value
    return count, total


def test_cost(cluster: Cluster, figures: Figures, request: pytest.FixtureRequest) -> None:
    """The MPI example (plugins Volcano runs itself) from creation to all Pods Running and to
    Completed, without the webhook and then with it installed, on the same node in one run; the API
    server's view of our webhook's admission time. Figures only: the target is docs/benchmarks.md's."""
    assert all(found is None for found in registrations(cluster).values()), "runs first in this module, before the product is installed"
    without = [run_job(cluster, runnable("mpi", MPI_PROGRAMS))[1] for _ in range(COST_RUNS)]
    request.getfixturevalue("installed")
    before = admission_seconds(cluster)
    with_webhook = [run_job(cluster, runnable("mpi", MPI_PROGRAMS))[1] for _ in range(COST_RUNS)]
    after = admission_seconds(cluster)
    for key in ("running", "done"):
        plain = sorted(t[key] for t in without)[COST_RUNS // 2]
        wired = sorted(t[key] for t in with_webhook)[COST_RUNS // 2]
        figures[f"cost_{key}_without_s"], figures[f"cost_{key}_with_s"] = plain, wired
        figures[f"cost_{key}_ratio"] = wired / plain
    calls = after[0] - before[0]
    figures["cost_admission_calls"] = calls
    figures["cost_admission_mean_ms"] = 1000 * (after[1] - before[1]) / calls if calls else None


# The jobs -------------------------------------------------------------------------------------------


def test_env(installed: Cluster, figures: Figures) -> None:
    """Volcano's env plugin: each Pod prints its index within its task."""
    volcano, times = run_job(installed, runnable("env"))
    record(figures, "env", times)
    pods = [p["metadata"]["name"] for p in volcano.pods("env-demo")]
    assert [logs(installed, volcano, pod).strip() for pod in pods] == [f"index {i}" for i in range(len(pods))], pods


def mpi_hosts(cluster: Cluster, volcano: VolcanoCluster, name: str) -> list[str]:
    """The host names the master's ``mpiexec ... hostname`` printed (ssh's notes left out)."""
    return sorted(line for line in logs(cluster, volcano, f"{name}-mpimaster-0").splitlines() if line.startswith(f"{name}-"))


def test_mpi_over_ssh(installed: Cluster, figures: Figures) -> None:
    """mpi + ssh + svc (Volcano's own plugins): ``mpiexec`` on the master starts a process on each
    worker over ssh with the plugins' keys and host list; the job completes as Volcano's MPI example
    completes (the master's TaskCompleted ends it)."""
    volcano, times = run_job(installed, runnable("mpi", MPI_PROGRAMS))
    times["completed_after_launcher"] = completed_after_launcher(volcano, "mpi-demo")
    record(figures, "mpi", times)
    assert mpi_hosts(installed, volcano, "mpi-demo") == ["mpi-demo-mpiworker-0", "mpi-demo-mpiworker-1"]
    # The workers' sshd, PID 1 by the example's exec, ends at Volcano's SIGTERM: not a 30 s grace period.
    assert times["completed_after_launcher"] < 10, times


def completed_after_launcher(volcano: VolcanoCluster, name: str) -> float:
    """Seconds from the master's container ending to the Job's Completed (both to the second, as
    the API server writes them)."""
    def at(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    job = volcano.get("Job", name) or {}
    master = volcano.get("Pod", f"{name}-mpimaster-0") or {}
    (status,) = (master.get("status") or {}).get("containerStatuses") or [{}]
    finished = ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
    assert finished, f"the master's container has not ended: {status}"
    return at(job["status"]["state"]["lastTransitionTime"]) - at(finished)


def test_mpi_with_late_workers_starts_once_with_waitfor(installed: Cluster, figures: Figures) -> None:
    """The waitfor example (our plugin, in the annotation) with its workers 30 s late: the master's
    init container waits for their ssh port, so ``mpiexec`` runs once and succeeds."""
    volcano, times = run_job(installed, runnable("waitfor", MPI_PROGRAMS, late="mpiworker"))
    record(figures, "mpi_waitfor_late", times)
    master = volcano.get("Pod", "waitfor-demo-mpimaster-0") or {}
    statuses = (master.get("status") or {}).get("containerStatuses") or []
    assert [s["restartCount"] for s in statuses] == [0], statuses
    assert mpi_hosts(installed, volcano, "waitfor-demo") == ["waitfor-demo-mpiworker-0", "waitfor-demo-mpiworker-1"]


@needs("torch")
def test_torchrun(installed: Cluster, figures: Figures) -> None:
    """Bare ``torchrun train.py`` on every Pod (our torchrun plugin's PET_*): the example's DDP script
    all-reduces its gradients across the three ranks, also with the workers 30 s late."""
    for volcano in run_with_a_late_task(installed, "torchrun", {}, "worker", figures,
                                        {"torchrun-demo-train": EXAMPLES / "torchrun" / "train.py"}):
        out = logs(installed, volcano, "torchrun-demo-master-0")
        assert "(world size 3)" in out and "done" in out, out


def lose_a_pod(cluster: Cluster, volcano: VolcanoCluster, job: Obj, pod: str, meanwhile: Callable[[], object] = bool) -> Obj:
    """Delete ``pod`` of a running job, as a node drain or an operator would; the job restarts
    (its PodEvicted → RestartJob policy), ``meanwhile()`` runs, the job completes, and none of its
    first Pods is left. Returns the Job as it ended."""
    name = job["metadata"]["name"]
    before = {p["metadata"]["uid"] for p in volcano.pods(name)}
    cluster.kubectl("-n", volcano.namespace, "delete", "pod", pod, "--wait=false")
    meanwhile()
    wait_phase(cluster, volcano, job, time.monotonic())
    ended = volcano.get("Job", name) or {}
    assert ended["status"].get("retryCount", 0) >= 1, ended["status"]
    assert {p["metadata"]["uid"] for p in volcano.pods(name)}.isdisjoint(before), "Pods of the first run are left"
    return ended


def ssh_key(volcano: VolcanoCluster, name: str) -> str:
    return str(((volcano.get("Secret", f"{name}-ssh") or {}).get("data") or {}).get("id_rsa.pub", ""))


def test_mpi_restarts_when_a_worker_is_lost(installed: Cluster, figures: Figures) -> None:
    """A worker deleted while the master waits to run: Volcano restarts the job with a new SSH key
    pair (its ssh plugin makes a new Secret), the new Pods mount it, and mpiexec reaches the new
    workers with it."""
    job = runnable("mpi", {**MPI_PROGRAMS, "mpimaster": ["/bin/sh", "-c", "sleep 10; " + MPI_PROGRAMS["mpimaster"][2]]})
    volcano, started = submit(installed, job)
    wait_phase(installed, volcano, job, started, until="Running")
    before = ssh_key(volcano, "mpi-demo")
    started = time.monotonic()
    # Volcano deletes the Secret when the job completes: the new one is read while the job reruns.
    lose_a_pod(installed, volcano, job, "mpi-demo-mpiworker-0", lambda: wait_until(
        lambda: ssh_key(volcano, "mpi-demo") not in ("", before), 120, "a new key pair for the restarted job"))
    figures["mpi_restart_to_completed_s"] = time.monotonic() - started
    assert mpi_hosts(installed, volcano, "mpi-demo") == ["mpi-demo-mpiworker-0", "mpi-demo-mpiworker-1"]


@needs("torch")
def test_torchrun_restarts_when_a_worker_is_lost(installed: Cluster, figures: Figures) -> None:
    """A worker deleted while the three ranks train: Volcano restarts the job, the webhook wires the
    new Pods (PET_*), and torchrun trains to the end."""
    job = runnable("torchrun")
    for task in job["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["env"].append({"name": "STEP_SECONDS", "value": "1"})
    volcano, started = submit(installed, job, {"torchrun-demo-train": EXAMPLES / "torchrun" / "train.py"})
    wait_until(lambda: "step 0:" in logs(installed, volcano, "torchrun-demo-master-0"), 180, "training to start", interval=1)
    started = time.monotonic()
    lose_a_pod(installed, volcano, job, "torchrun-demo-worker-0")
    figures["torchrun_restart_to_completed_s"] = time.monotonic() - started
    env = {e["name"] for e in (volcano.get("Pod", "torchrun-demo-worker-0") or {})["spec"]["containers"][0]["env"]}
    assert {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"} <= env, env
    assert "done" in logs(installed, volcano, "torchrun-demo-master-0")


@needs("torch")
def test_elastic_torchrun_loses_a_node_and_finishes(installed: Cluster, figures: Figures) -> None:
    """docs/plugins.md's elastic torchrun (2 to 3 nodes), without the job restart policy: a worker
    deleted mid-training is made again by Volcano's controller, the agents restart their workers into
    a new round that the replacement joins, and training runs to its end in a world of 3."""
    job = runnable("torchrun")
    job["metadata"]["annotations"]["volcano-job-webhook/plugins"] = json.dumps(
        {"torchrun": ["--master=master", "--worker=worker", "--nproc-per-node=1", "--min-nodes=2", "--max-nodes=3",
                      "--max-restarts=3"]})
    job["spec"].pop("policies")
    for task in job["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["env"].append({"name": "STEP_SECONDS", "value": "1"})
    volcano, started = submit(installed, job, {"torchrun-demo-train": EXAMPLES / "torchrun" / "train.py"})
    # With c10d the rendezvous ranks the nodes: rank 0, which prints, may be any Pod.
    def everyone_logs() -> list[str]:
        return [logs(installed, volcano, p["metadata"]["name"]) for p in volcano.pods("torchrun-demo")]

    def everyone() -> str:
        return "\n".join(everyone_logs())

    wait_until(lambda: "step 0:" in everyone(), 180, "training to start", interval=1)
    lost = (volcano.get("Pod", "torchrun-demo-worker-0") or {})["metadata"]["uid"]
    installed.kubectl("-n", volcano.namespace, "delete", "pod", "torchrun-demo-worker-0", "--wait=false")
    deleted = time.monotonic()
    wait_phase(installed, volcano, job, started)
    figures["torchrun_elastic_lost_to_completed_s"] = time.monotonic() - deleted
    assert (volcano.get("Pod", "torchrun-demo-worker-0") or {})["metadata"]["uid"] != lost
    assert (volcano.get("Job", "torchrun-demo") or {})["status"].get("retryCount", 0) == 0, "the job was restarted whole"
    # The last round, the one that ends, has the replacement in it: a world of 2 would say so.
    ended = [out for out in everyone_logs() if re.search(r"^done$", out, re.MULTILINE)]
    assert len(ended) == 1 and re.findall(r"\(world size (\d+)\)", ended[0])[-1:] == ["3"], everyone()


@needs("torch")
def test_pytorch(installed: Cluster, figures: Figures) -> None:
    """Volcano's pytorch plugin (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, the wait for the
    master): the torchrun example's DDP script, run as ``python train.py``, reads them through env://."""
    volcano, times = run_job(installed, runnable("pytorch"), files=PYTORCH_FILES)
    record(figures, "pytorch", times)
    check_pytorch(installed, volcano)


PYTORCH_FILES = {"pytorch-demo-train": EXAMPLES / "torchrun" / "train.py"}


def check_pytorch(cluster: Cluster, volcano: VolcanoCluster) -> None:
    out = logs(cluster, volcano, "pytorch-demo-master-0")
    assert "(world size 3)" in out and "done" in out, out


TF_TRAIN = """
import json, os
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = tf.Variable([0.0, 0.0])
def step():
    task = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.distribute.get_replica_context().all_reduce("sum", tf.cast(task, tf.float32) + 1.0)
print("ALLREDUCE", float(strategy.experimental_local_results(strategy.run(step))[0]), flush=True)
"""


@needs("tensorflow")
def test_tensorflow(installed: Cluster, figures: Figures) -> None:
    """The tensorflow plugin's TF_CONFIG: the chief and the workers join one
    MultiWorkerMirroredStrategy and all-reduce in sync (1 + 2 + 3 = 6 on every Pod), also with the
    chief 30 s late."""
    programs = {t: ["python", "-c", TF_TRAIN] for t in ("chief", "worker")}
    for volcano in run_with_a_late_task(installed, "tensorflow", programs, "chief", figures):
        for pod in volcano.pods("tf-demo"):
            assert "ALLREDUCE 6.0" in logs(installed, volcano, pod["metadata"]["name"])


RAY_DRIVER = """
import socket, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto")
@ray.remote(num_cpus=0)
def where():
    return socket.gethostname()
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
print("HOSTS", " ".join(sorted(ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                                       for n in nodes]))))
"""


@needs("ray")
def test_ray(installed: Cluster, figures: Figures) -> None:
    """Volcano's ray plugin (with svc): its own ``ray start`` commands form one cluster of three
    nodes; a driver on the head runs a task on each node."""
    volcano, times = run_job(installed, runnable("ray"), until="Running")
    started = time.monotonic()
    check_ray(installed, volcano)
    times["driver"] = time.monotonic() - started
    record(figures, "ray", times)


def check_ray(cluster: Cluster, volcano: VolcanoCluster, name: str = "ray-demo") -> None:
    """A driver on the head reaches each of the three nodes (tried until it does, 120 s)."""
    def answered() -> str:
        try:
            out = cluster.kubectl("-n", volcano.namespace, "exec", f"{name}-head-0", "--", "python", "-c", RAY_DRIVER, timeout=120)
        except AssertionError:
            return ""
        hosts = [line for line in out.splitlines() if line.startswith("HOSTS ")]
        return hosts[0] if hosts and len(hosts[0].split()) == 4 else ""

    try:
        hosts = wait_until(answered, 120, "a Ray driver reaching three nodes", interval=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(cluster, volcano, name)}") from None
    assert hosts.split()[1:] == [f"{name}-head-0", f"{name}-worker-0", f"{name}-worker-1"]


JAX_PROGRAM = ("import os, jax; jax.distributed.initialize(num_processes=int(os.environ['JAX_NUM_PROCESSES']), "
               "process_id=int(os.environ['JAX_PROCESS_ID'])); print('JAX', jax.process_index(), jax.process_count(), "
               "jax.device_count(), flush=True)")


@needs("jax")
def test_jax(installed: Cluster, figures: Figures) -> None:
    """Our jax plugin: ``jax.distributed.initialize`` with the process count and id from its
    variables (the coordinator address from JAX_COORDINATOR_ADDRESS) joins the four processes,
    also with the leader 30 s late."""
    programs = {t: ["python", "-c", JAX_PROGRAM] for t in ("leader", "worker")}
    for volcano in run_with_a_late_task(installed, "jax", programs, "leader", figures):
        out = logs(installed, volcano, "jax-demo-leader-0")
        assert "JAX 0 4 4" in out, out


@needs("xgboost")
def test_xgboost(installed: Cluster, figures: Figures) -> None:
    """Our xgboost plugin's DMLC_*: the example's training script on the tracker and three workers."""
    volcano, times = run_job(installed, runnable("xgboost", XGBOOST_PROGRAMS), files=XGBOOST_FILES)
    record(figures, "xgboost", times)
    check_xgboost(installed, volcano)


XGBOOST_PROGRAMS = {t: ["python", "/workspace/train.py"] for t in ("master", "worker")}
XGBOOST_FILES = {"xgboost-demo-train": EXAMPLES / "xgboost" / "train.py"}


def check_xgboost(cluster: Cluster, volcano: VolcanoCluster) -> None:
    models = {line.rsplit(" ", 1)[1] for pod in volcano.pods("xgboost-demo")
              for line in logs(cluster, volcano, pod["metadata"]["name"]).splitlines() if line.startswith("worker ")}
    assert len(models) == 1, f"the four workers did not train one model together: {models}"


@needs("paddle")
def test_paddle(installed: Cluster, figures: Figures) -> None:
    """Our paddle plugin's PADDLE_*: a plain ``python -m paddle.distributed.launch train.py`` on
    every Pod meets at the master's rendezvous and trains one model (every rank ends with the same
    weights); the launcher writes the trainer's output to ./log, which the program then prints."""
    volcano, times = run_job(installed, runnable("paddle", PADDLE_PROGRAMS), files=PADDLE_FILES)
    record(figures, "paddle", times)
    check_paddle(installed, volcano)


PADDLE_LAUNCH = "python -m paddle.distributed.launch /opt/train/train.py; code=$?; cat log/workerlog.0; exit $code"
PADDLE_PROGRAMS = {t: ["sh", "-c", PADDLE_LAUNCH] for t in ("master", "worker")}
PADDLE_FILES = {"paddle-demo-train": EXAMPLES / "paddle" / "train.py"}


def check_paddle(cluster: Cluster, volcano: VolcanoCluster) -> None:
    results = [re.search(r"^rank (\d+)/(\d+): loss [\d.]+ -> [\d.]+, weights (\S+)$", logs(cluster, volcano, name), re.MULTILINE)
               for name in ("paddle-demo-master-0", "paddle-demo-worker-0", "paddle-demo-worker-1")]
    assert all(results), diagnostics(cluster, volcano, "paddle-demo")
    assert [(m[1], m[2]) for m in results if m] == [("0", "3"), ("1", "3"), ("2", "3")]
    assert len({m[3] for m in results if m}) == 1, "the ranks ended with different weights"


@contextmanager
def advertised(cluster: Cluster, resource: str, count: int) -> Iterator[None]:
    """The node offers ``count`` of an extended resource (Kubernetes' "advertise extended resources
    for a node": no device plugin, so the kubelet admits the Pods and hands them nothing)."""
    path = f"/status/%s/{resource.replace('/', '~1')}"
    patch = [{"op": "add", "path": path % field, "value": str(count)} for field in ("capacity", "allocatable")]
    cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=json", "-p", json.dumps(patch))
    try:
        yield
    finally:
        gone = [{"op": "remove", "path": path % field} for field in ("capacity", "allocatable")]
        cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=json", "-p", json.dumps(gone))


def test_hostfile(installed: Cluster, figures: Figures) -> None:
    """Our hostfile plugin's Open MPI file (``slots=2`` from each worker's GPU limit) with mpi, ssh
    and svc: the example's ``mpiexec -np 4``, given no host, reads the file through
    OMPI_MCA_orte_default_hostfile and starts two ranks on each worker."""
    with advertised(installed, "nvidia.com/gpu", 4):
        job = runnable("hostfile", {"mpimaster": ["/bin/sh", "-c", "mpiexec --allow-run-as-root -np 4 hostname"]})
        volcano, times = run_job(installed, job)
    record(figures, "hostfile", times)
    assert mpi_hosts(installed, volcano, "hostfile-demo") == ["hostfile-demo-worker-0"] * 2 + ["hostfile-demo-worker-1"] * 2


DEEPSPEED_RANK = """
import socket
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from DeepSpeed's launcher
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(f"RANK {dist.get_rank()}/{dist.get_world_size()} {socket.gethostname()} sum {int(total.item())}", flush=True)
"""


@needs("torch", "deepspeed")
def test_deepspeed(installed: Cluster, figures: Figures) -> None:
    """The hostfile example with ``--format=deepspeed``: a bare ``deepspeed rank.py`` on the master
    reads /job/hostfile (its default path), asks the first worker its address over ssh, and starts
    its launcher on each worker through pdsh over ssh (DeepSpeed's default), two ranks a worker from
    the file's slots, which all-reduce across both workers (1 + 2 + 3 + 4 = 10). The ranks join
    through torch.distributed: ``deepspeed.init_distributed`` on CPU first compiles a shared-memory
    op, and the jobs' image has no compiler."""
    job = runnable("hostfile", {"mpimaster": ["deepspeed", "/opt/train/rank.py"]})
    annotations = job["metadata"]["annotations"]
    annotations["volcano-job-webhook/plugins"] = annotations["volcano-job-webhook/plugins"].replace("openmpi", "deepspeed")
    for task in job["spec"]["tasks"]:  # the ranks' script, on every Pod (Open MPI runs it on the workers)
        spec = task["template"]["spec"]
        spec.setdefault("volumes", []).append({"name": "train", "configMap": {"name": "deepspeed-rank"}})
        spec["containers"][0].setdefault("volumeMounts", []).append({"name": "train", "mountPath": "/opt/train"})
    script = Path(installed.node.workdir) / "rank.py"
    script.write_text(DEEPSPEED_RANK)
    with advertised(installed, "nvidia.com/gpu", 4):
        volcano, times = run_job(installed, job, files={"deepspeed-rank": script})
    record(figures, "deepspeed", times)
    # Through pdsh each line has its host in front, and two ranks of a host may share one.
    ranks = sorted(re.findall(r"RANK (\d+)/(\d+) (\S+) sum (\d+)", logs(installed, volcano, "hostfile-demo-mpimaster-0")))
    hosts = ["hostfile-demo-worker-0"] * 2 + ["hostfile-demo-worker-1"] * 2
    assert ranks == [(str(r), "4", host, "10") for r, host in enumerate(hosts)], diagnostics(installed, volcano, "hostfile-demo")


# Late starters, for the jobs whose tests above run them together only: one task's Pods 30 s late,
# the four jobs at once, in four namespaces (the wait is sleep: together they cost one wait).
LATE: dict[str, tuple[str, str, Mapping[str, Sequence[str]], Mapping[str, Path], Callable[[Cluster, VolcanoCluster], None]]] = {
    # example: (its extra's module, the late task, programs, files, the check)
    "pytorch": ("torch", "master", {}, PYTORCH_FILES, check_pytorch),  # the workers' wait for the master holds them
    "xgboost": ("xgboost", "worker", XGBOOST_PROGRAMS, XGBOOST_FILES, check_xgboost),
    "paddle": ("paddle", "master", PADDLE_PROGRAMS, PADDLE_FILES, check_paddle),
    "ray": ("ray", "head", {}, {}, check_ray),  # the workers' `ray start` retries the head's GCS
}


def test_one_task_late(installed: Cluster, figures: Figures) -> None:
    """pytorch with its master late, XGBoost with its workers late, Paddle with its master late,
    Ray with its head late: each job completes (Ray: runs, and its driver reaches every node) as
    it does when its Pods start together. Those whose extra is not installed are left out."""
    cases = {name: case for name, case in LATE.items() if importlib.util.find_spec(case[0])}
    if not cases:
        pytest.skip("needs one of the torch, xgboost, paddle or ray extras")
    submitted = {}
    for example, (_, late, programs, files, _) in cases.items():
        job = runnable(example, programs, late=late)
        submitted[example] = (job, *submit(installed, job, files))
    for example, (job, volcano, started) in submitted.items():
        until = "Running" if example == "ray" else "Completed"
        record(figures, f"{example}_{cases[example][1]}_late", wait_phase(installed, volcano, job, started, until))
        cases[example][4](installed, volcano)
