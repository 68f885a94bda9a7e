"""The example jobs as a user takes them: files ``kubectl apply -f`` can apply again and again, so
nothing in them that the API server assigns (a uid is immutable: a second apply of a file that names
one is refused); peers that run until stopped end when Kubernetes stops them. That the files
survive apply, apply again, server-side apply, delete and apply on a real API server is
tests/test_envtest_examples.py's."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES
from volcano_job_webhook.plugins import read_workload

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
            time.sleep(0.5)  # for the script to get as far as its sshd or its sleep
            os.kill(pid1[0], signal.SIGTERM)
            try:
                unshare.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{where}: under {shell}, PID 1 ignored SIGTERM: {script!r}")
        finally:
            if unshare.poll() is None:
                unshare.kill()
