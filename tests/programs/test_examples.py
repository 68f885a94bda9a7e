"""The example jobs as a user takes them: files ``kubectl apply -f`` can apply again and again, so
nothing in them that the API server assigns (a uid is immutable: a second apply of a file that names
one is refused); Pods a laptop cluster can hold, or a first comment saying what they need; peers
that run until stopped end when Kubernetes stops them; what docs/plugins.md advises for a peer that
starts late. That the files survive apply, apply again, server-side apply, delete and apply on a
real API server is tests/apiserver/test_envtest_examples.py's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.plugins import read_workload
from volcano_job_webhook.plugins.builtin.quantity import parse_quantity
from volcano_job_webhook.plugins.keys import PLUGINS_ANNOTATION

EXAMPLE_FILES = sorted((EXAMPLES / "jobs").glob("*.yaml")) + sorted((EXAMPLES / "workloads").glob("*.yaml"))
ASSIGNED = {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink"}


def load(path: Path) -> dict:
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(obj, dict), path
    return obj


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_example_names_nothing_the_api_server_assigns(path: Path) -> None:
    obj = load(path)
    assert not ASSIGNED & obj["metadata"].keys(), f"{path.name}: metadata.{sorted(ASSIGNED & obj['metadata'].keys())}"
    assert "status" not in obj


@pytest.mark.parametrize("path", sorted((EXAMPLES / "jobs").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_task_names_what_volcanos_admission_fills_in(path: Path) -> None:
    """``minAvailable`` (the task's replicas) and ``maxRetry`` (3), as Volcano's job admission sets
    them on create: a second ``kubectl apply`` would otherwise clear them, and Volcano refuses that
    update (tests/apiserver/test_envtest_examples.py shows both)."""
    for task in load(path)["spec"]["tasks"]:
        assert (task.get("minAvailable"), task.get("maxRetry")) == (task["replicas"], 3), f"{path.name}: task {task['name']}"


# A laptop cluster -----------------------------------------------------------------------------------

# kind or minikube on a laptop: one node of 4 CPUs and 8 GiB, no GPU. Its own Pods (API server, etcd,
# controller-manager, scheduler, CoreDNS, the CNI) and Volcano's ask about 1 CPU and a GiB or two of
# that, so an example's Pods together may ask for 3 CPUs and 6 GiB.
LAPTOP_CPU = parse_quantity("3")
LAPTOP_MEMORY = parse_quantity("6Gi")


def pod_requests(template: dict) -> dict[str, Decimal]:
    """What the scheduler reserves for one Pod of ``template``: each container's requests (its limits
    where it gives no request, as the API server defaults them), summed over the containers, or the
    largest init container's where that is more."""
    def of(container: dict) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(value) for name, value in asked.items()}

    spec = template.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in of(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def job_requests(obj: dict) -> dict[str, Decimal]:
    """The requests of every Pod of the workload at once (a Volcano Job's tasks start as a gang)."""
    total: dict[str, Decimal] = {}
    for task in read_workload(obj).tasks:
        for name, amount in pod_requests(dict(task.template)).items():
            total[name] = total.get(name, Decimal(0)) + amount * task.replicas
    return total


def leading_comment(path: Path) -> str:
    """The comment lines a file starts with, without their ``#``."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_example_fits_a_laptop_cluster_or_says_what_it_needs(path: Path) -> None:
    """Its Pods together ask for at most 3 CPUs and 6 GiB and nothing a laptop lacks (a GPU, an NPU);
    otherwise its first comment says, on a line of its own beginning ``Needs:``, what it needs (each
    resource by name) and why."""
    asked = job_requests(load(path))
    over = [name for name, amount in asked.items()
            if amount and (name not in ("cpu", "memory") or amount > {"cpu": LAPTOP_CPU, "memory": LAPTOP_MEMORY}[name])]
    if not over:
        return
    needs = [line for line in leading_comment(path).splitlines() if line.startswith("Needs:")]
    assert needs, f"{path.name} asks for {({n: str(asked[n]) for n in over})}: more than a laptop has, and no 'Needs:' line first"
    words = {"cpu": "CPU", "memory": "GiB"}
    for name in over:
        assert words.get(name, name) in needs[0], f"{path.name}: its 'Needs:' line does not name {name}"
    first = leading_comment(path).splitlines()[0]
    assert first.startswith("Needs:"), f"{path.name}: the 'Needs:' line comes first, not {first!r}"


def test_the_laptop_sums_count_requests_limits_and_replicas() -> None:
    template = {"spec": {"containers": [{"resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "500m"}}},
                                        {"resources": {"requests": {"memory": "256Mi"}}}],
                         "initContainers": [{"resources": {"requests": {"cpu": "1"}}}]}}
    assert pod_requests(template) == {"cpu": Decimal("1"), "memory": parse_quantity("4Gi") + parse_quantity("256Mi")}
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"tasks": [{"name": "a", "replicas": 3, "template": template}, {"name": "b", "replicas": 0, "template": template}]}}
    assert job_requests(job)["cpu"] == Decimal("3")


# A peer that runs until it is stopped ----------------------------------------------------------------

# sshd (an MPI worker), or a sleep that keeps a Pod up to look at.
RUNS_UNTIL_STOPPED = re.compile(r"\bsshd -D\b|\bsleep [0-9]+")
SHELLS = ("sh", "/bin/sh", "bash", "/bin/bash")


def scripts_that_run_until_stopped() -> list[tuple[str, str]]:
    """``(where, script)`` of every example container whose command is a shell's ``-c`` script
    running a server or a sleep that never ends on its own."""
    found = []
    for path in EXAMPLE_FILES:
        for task in read_workload(load(path)).tasks:
            for container in (task.template.get("spec") or {}).get("containers") or []:
                command = [*(container.get("command") or []), *(container.get("args") or [])]
                if len(command) == 3 and command[0] in SHELLS and command[1] == "-c" and RUNS_UNTIL_STOPPED.search(command[2]):
                    found.append((f"{path.stem}/{task.name}", command[2]))
    return found


FOREVER = scripts_that_run_until_stopped()


def test_the_peers_that_run_until_stopped_are_the_ones_expected() -> None:
    assert {where for where, _ in FOREVER} == {
        "mpi-job/mpiworker", "hostfile-job/worker", "waitfor-job/mpiworker", "svc-job/master", "svc-job/worker"}


def pid_namespaces_missing() -> str | None:
    if os.geteuid() != 0:
        return "running a script as PID 1 of its own PID namespace needs root"
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def catches_sigterm(pid: int) -> bool:
    """Whether ``pid`` handles SIGTERM: its bit in SigCgt of /proc/PID/status."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize("shell", ["dash", "busybox"])
@pytest.mark.parametrize(("where", "script"), FOREVER, ids=[where for where, _ in FOREVER])
def test_a_peer_that_runs_until_stopped_ends_at_sigterm(where: str, script: str, shell: str, tmp_path: Path) -> None:
    """Its script, run as the container runs it: PID 1 of a PID namespace of its own, where the
    kernel delivers SIGTERM only to a process that handles it. The shell must hand PID 1 to sshd
    (``exec``) or handle SIGTERM itself (``trap``), else the Pod outlives the kubelet's SIGTERM and is
    killed only at the end of the grace period (30 s): the MPI job reached Completed some 32 s after
    its launcher ended. Under Debian's ``/bin/sh`` (dash, which forks even a lone command) and
    busybox's ``sh``; sshd is a stand-in that, like it, exits on SIGTERM."""
    reason = pid_namespaces_missing()
    binary = shutil.which(shell)
    if reason or binary is None:
        pytest.skip(reason or f"{shell} is not installed")
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed (the stand-in sshd runs under its sh)")
    standin = tmp_path / "sshd"
    standin.write_text(f"#!{busybox} sh\ntrap 'exit 0' TERM\nsleep 100000 &\nwait\n")
    standin.chmod(0o755)
    run = script.replace("/usr/sbin/sshd", str(standin)).replace("/run/sshd", str(tmp_path / "run-sshd"))
    argv = [binary, *(["sh"] if shell == "busybox" else []), "-c", run]
    with subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *argv],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as unshare:
        try:
            deadline = time.monotonic() + 10
            while not (pid1 := children(unshare.pid)):
                assert time.monotonic() < deadline, f"{where}: the script did not start"
                time.sleep(0.02)
            # The signal is sent once PID 1 handles it (a trap, or sshd after exec), not after a
            # guess of how long that takes; a script that never does fails the same way, 10 s later.
            while not catches_sigterm(pid1[0]) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(pid1[0], signal.SIGTERM)
            try:
                unshare.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{where}: under {shell}, PID 1 ignored SIGTERM: {script!r}")
        finally:
            if unshare.poll() is None:
                unshare.kill()


# When a peer starts late (docs/plugins.md#when-a-peer-starts-late) --------------------------------


def example(name: str) -> dict:
    return load(EXAMPLES / "jobs" / f"{name}-job.yaml")


def restart_policies(obj: dict) -> dict[str, str]:
    return {t["name"]: t["template"]["spec"].get("restartPolicy", "Always") for t in obj["spec"]["tasks"]}


def restarts_on_eviction(obj: dict) -> bool:
    return {"event": "PodEvicted", "action": "RestartJob"} in (obj["spec"].get("policies") or [])


def test_the_examples_follow_what_the_docs_advise_when_a_peer_starts_late() -> None:
    # MPI: the master restarts until the workers answer; waitfor's example starts it once, after port 22 answers.
    for name in ("mpi", "hostfile", "waitfor"):
        obj = example(name)
        assert restart_policies(obj)["mpimaster"] == "OnFailure", name
    waitfor = json.loads(example("waitfor")["metadata"]["annotations"][PLUGINS_ANNOTATION])["waitfor"]
    assert "--tasks=mpiworker" in waitfor and "--port=22" in waitfor
    # torchrun: the master's name resolves before it is Ready; an agent that gives up starts again.
    torchrun = example("torchrun")
    assert "--publish-not-ready-addresses" in torchrun["spec"]["plugins"]["svc"]
    assert set(restart_policies(torchrun).values()) == {"OnFailure"}
    # TensorFlow: a process that gives up before its peers answer runs again in its Pod.
    assert set(restart_policies(example("tensorflow")).values()) == {"OnFailure"}
    # pytorch: the workers wait for the master's port.
    assert "--wait-master-enabled" in example("pytorch")["spec"]["plugins"]["pytorch"]
    # A Pod lost once the job runs: every Pod made again.
    assert all(restarts_on_eviction(example(name)) for name in ("mpi", "torchrun", "tensorflow"))
