"""The waitfor plugin's init container, run for real.

The script comes from the chain (examples/jobs/waitfor-job.yaml, flags varied through the plugin
annotation) and runs under ``/bin/sh`` and under busybox's ``sh`` with nothing but busybox's
applets on ``PATH``, as in the ``busybox`` image. Stand-ins on ``PATH`` take the network's place:

* ``nslookup`` answers the names it is given (a Pod's name, fully qualified: ``<host>.``, or under a
  search domain) from the N-th question on and fails every other, counting the questions in a file;
* ``nc`` sends busybox's real ``nc`` to 127.0.0.1 instead of the Pod's name (which does not resolve
  here), so the port check meets a real listening socket, or none;
* ``sleep`` records the pause the script asks for, sleeps briefly, and moves a clock on by the pause;
* ``date +%s`` reads that clock, so a round takes no time and the script's timings are exact whatever
  the machine's load (a loaded CI once spent the whole of ``--timeout=1`` on the first round).

Without busybox the busybox runs and the port checks (busybox's ``nc``) skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.podgen import make_pod

BUSYBOX = shutil.which("busybox")
needs_busybox = pytest.mark.skipif(BUSYBOX is None, reason="busybox is not installed (apt-get install busybox)")
HOSTS = ["waitfor-demo-mpiworker-0.waitfor-demo", "waitfor-demo-mpiworker-1.waitfor-demo"]
JOB = "default/waitfor-demo"

NSLOOKUP = """#!/bin/sh
echo "$1" >> '{log}'
for name in {answers}; do
  if [ "$1" = "$name" ]; then
    [ "$(grep -c -x -F "$1" '{log}')" -ge {answer_from} ] && exit 0
  fi
done
echo "** server can't find $1: NXDOMAIN"
exit 1
"""
NC = """#!/bin/sh
# The script's call is: nc -w SECONDS HOST PORT -e true
[ $# = 6 ] && [ "$1" = -w ] && [ "$5 $6" = "-e true" ] || {{ echo "unexpected nc call: $*" >&2; exit 2; }}
echo "$3" >> '{log}'
exec '{busybox}' nc -w "$2" 127.0.0.1 "$4" -e true
"""
SLEEP = """#!/bin/sh
echo "$1" >> '{log}'
echo $(($(cat '{clock}') + $1)) > '{clock}'
exec {real_sleep} 0.05
"""
DATE = """#!/bin/sh
[ "$*" = +%s ] || {{ echo "unexpected date call: $*" >&2; exit 2; }}
cat '{clock}'
"""


@dataclass
class Shell:
    name: str
    argv: list[str]  # runs ["-c", script] appended
    path: list[str]  # PATH after the stand-ins


@pytest.fixture(scope="module")
def busybox_applets(tmp_path_factory) -> Path | None:
    """A directory of busybox's applets, as the busybox image's /bin."""
    if BUSYBOX is None:
        return None
    applets = tmp_path_factory.mktemp("busybox-bin")
    names = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        (applets / name).symlink_to(BUSYBOX)
    return applets


def init_container(args: list[str]) -> dict:
    job_obj = yaml.safe_load((EXAMPLES / "jobs" / "waitfor-job.yaml").read_text())
    job_obj["metadata"]["annotations"]["volcano-job-webhook/plugins"] = json.dumps({"waitfor": args})
    job = Job.from_object(job_obj)
    pod = Chain().mutate(job, make_pod(job, "mpimaster", 0)).pod
    (container,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "wait-for-tasks"]
    return container


@dataclass
class Run:
    code: int
    out: str
    err: str
    asked: list[str]  # every name nslookup was asked, in order
    connected: list[str]  # the host of every port check
    slept: list[str]  # the argument of every sleep


def run(
    shell: Shell, tmp: Path, args: list[str], answer_from: int, answers: list[str] | None = None, resolv_conf: str | None = None
) -> Run:
    """The init container's script under ``shell``; nslookup answers ``answers`` (default: each Pod's
    name, fully qualified) from the ``answer_from``-th question on. ``resolv_conf`` stands in for
    /etc/resolv.conf."""
    container = init_container(args)
    assert container["image"] == "busybox:1.36.1"
    assert container["command"][:2] == ["sh", "-c"]
    work = tmp / shell.name / "-".join(args).replace("/", "_")
    stubs = work / "bin"
    stubs.mkdir(parents=True)
    logs = {name: work / f"{name}.log" for name in ("nslookup", "nc", "sleep")}
    for log in logs.values():
        log.touch()
    real_sleep = f"'{BUSYBOX}' sleep" if shell.name == "busybox" else "/bin/sleep"
    clock = work / "clock"
    clock.write_text("1700000000\n")
    scripts = {
        "nslookup": NSLOOKUP.format(log=logs["nslookup"], answers=" ".join(answers or [f"{h}." for h in HOSTS]), answer_from=answer_from),
        "nc": NC.format(log=logs["nc"], busybox=BUSYBOX),
        "sleep": SLEEP.format(log=logs["sleep"], clock=clock, real_sleep=real_sleep),
        "date": DATE.format(clock=clock),
    }
    for name, text in scripts.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    script = container["command"][2]
    if resolv_conf is not None:
        assert script.count("/etc/resolv.conf") == 1
        (work / "resolv.conf").write_text(resolv_conf)
        script = script.replace("/etc/resolv.conf", str(work / "resolv.conf"))
    env = {"PATH": os.pathsep.join([str(stubs), *shell.path]), "LC_ALL": "C"}
    done = subprocess.run(
        [*shell.argv, "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    lines = {name: log.read_text().split() for name, log in logs.items()}
    return Run(done.returncode, done.stdout, done.stderr, lines["nslookup"], lines["nc"], lines["sleep"])


def search_domains() -> list[str]:
    """What the script reads from this machine's /etc/resolv.conf."""
    try:
        text = Path("/etc/resolv.conf").read_text()
    except OSError:
        return []
    return [d for line in text.splitlines() if line.split()[:1] in (["search"], ["domain"]) for d in line.split()[1:]]


@pytest.fixture(params=["sh", "busybox"])
def shell(request, busybox_applets) -> Shell:
    if request.param == "sh":
        return Shell("sh", ["/bin/sh"], ["/usr/local/bin", "/usr/bin", "/bin"])
    if busybox_applets is None:
        pytest.skip("busybox is not installed (apt-get install busybox)")
    return Shell("busybox", [str(BUSYBOX), "sh"], [str(busybox_applets)])


def test_waits_until_every_pod_resolves(shell, tmp_path):
    result = run(shell, tmp_path, ["--tasks=mpiworker"], answer_from=3)
    assert result.code == 0, result
    lines = result.out.splitlines()
    assert lines[0] == f"waitfor: job {JOB}: waiting up to 300s for the 2 Pods of tasks mpiworker to resolve"
    # The same state twice in a row is logged once.
    assert lines[1:] == [
        f"waitfor: job {JOB}: 2 of 2 Pods not ready; first: {HOSTS[0]} does not resolve (0s of 300s)",
        f"waitfor: job {JOB}: all 2 Pods of tasks mpiworker ready after 4s",
    ]
    # Three rounds: each Pod's name asked three times under every search domain and on its own.
    asked = Counter(result.asked)
    for host in HOSTS:
        for name in [f"{host}.{d}." for d in search_domains()] + [f"{host}."]:
            assert asked[name] == 3, (name, asked)
    assert sum(asked.values()) == 3 * len(HOSTS) * (len(search_domains()) + 1)
    assert result.slept == ["2", "2"], "a pause of 2 s between rounds"
    assert result.connected == [], "no port check without --port"
    assert result.err == ""


def test_tries_every_search_domain_with_fully_qualified_names(shell, tmp_path):
    """As in a Pod: the short name is unknown to the DNS server; it resolves under the namespace's
    search domain, which the script applies itself."""
    resolv = "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
    answers = [f"{h}.default.svc.cluster.local." for h in HOSTS]
    result = run(shell, tmp_path, ["--tasks=mpiworker"], answer_from=1, answers=answers, resolv_conf=resolv)
    assert result.code == 0, result
    assert result.asked == answers, "the first search domain answers; nothing else is asked"
    assert result.slept == []


def test_times_out_with_a_line_naming_the_missing_pod(shell, tmp_path):
    result = run(shell, tmp_path, ["--tasks=mpiworker", "--timeout=1"], answer_from=10**6)
    assert result.code == 1, result
    assert re.fullmatch(
        rf"waitfor: job {JOB}: timed out after 2s: 2 of 2 Pods not ready; first: {re.escape(HOSTS[0])} does not resolve\n",
        result.err,
    ), result.err
    assert result.slept == ["2"], "it retried once before giving up"
    assert f"{HOSTS[1]}." in result.asked, "every Pod is asked about in a round"


def test_timeout_zero_is_a_single_round(shell, tmp_path):
    result = run(shell, tmp_path, ["--tasks=mpiworker", "--timeout=0"], answer_from=10**6)
    assert result.code == 1 and "timed out after 0s" in result.err, result
    assert result.slept == []


@needs_busybox
def test_waits_for_a_port_that_answers(shell, tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        result = run(shell, tmp_path, ["--tasks=mpiworker", f"--port={port}"], answer_from=1)
    assert result.code == 0, result
    assert result.out.splitlines()[0].endswith(f"to resolve and answer on port {port}")
    assert result.connected == HOSTS
    assert result.slept == []


@needs_busybox
def test_times_out_on_a_port_nobody_listens_on(shell, tmp_path):
    with socket.socket() as taken:  # a port number that was free a moment ago: nothing listens on it
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    result = run(shell, tmp_path, ["--tasks=mpiworker", f"--port={port}", "--timeout=1"], answer_from=1)
    assert result.code == 1, result
    assert f"first: {HOSTS[0]} does not answer on port {port}\n" in result.err, result.err
    assert result.connected == HOSTS * 2, "every Pod, in each of the two rounds"
