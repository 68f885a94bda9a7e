"""The ray plugin's ``ray start`` commands, run by Ray itself.

Each Pod of the example job (one head, two workers) runs its container's command exactly as the
chain writes it (``sh -c "ray start --head ..."`` / ``sh -c "ray start --address=<head Pod>:<port>"``),
as a local process in namespaces of its own (``unshare``), the little of a container Ray depends on:

* the Pod's host name (UTS), so each node can say where it runs;
* its own ``/tmp`` (mount): Ray keeps a node's sessions, sockets and logs under the temp dir, and a
  worker node takes the head's temp-dir *path*; in one shared ``/tmp`` two worker nodes started at
  once pick the same socket names and one raylet dies (``bind: Address already in use``);
* an ``/etc/hosts`` (mount) in which every Pod's domain name resolves to a loopback address of its
  own (127.0.0.2, ...), as the job's headless Service resolves them in a cluster;
* its own process tree (PID), so stopping the Pod stops every process Ray started in it.

The head's three ports move to free ones through the plugin's own flags; nothing else of the
commands changes. The template environment gets ``RAY_USAGE_STATS_ENABLED=0`` (else Ray's head
reports usage over the internet) and a 100 MB cap on each node's object store. A driver in the head
Pod (``nsenter``, as ``kubectl exec`` would) must then see every Pod as an alive node and run one
task on each node, pinned there by ``NodeAffinitySchedulingStrategy``, that returns the host name of
the Pod it ran in. Needs the ``ray`` extra (``pip install -e '.[ray]'``) and ``unshare`` with the
right to make those namespaces (root); skipped without them.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# Found, not imported: the framework runs in the Pods' processes only, not in pytest's.
if importlib.util.find_spec("ray") is None:
    pytest.skip("needs the ray extra (pip install -e '.[ray]')", allow_module_level=True)

from tests.envtest import Process, wait_until
from tests.wiring import unused_ports
from volcano_job_webhook.plugins import Chain, read_workload
from volcano_job_webhook.plugins.podgen import make_pod

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "jobs" / "ray-job.yaml"
BIN = Path(sys.executable).parent

# Inside the new namespaces: the Pod's /etc/hosts and /tmp, its host name, then its command as given.
# What this test runs from (the checkout, the virtualenv that holds `ray`) stays where it is when it
# lives under /tmp (as a CI clone may): each path of $4 is bound into the Pod's /tmp first.
ENTER_POD = ('mount --bind "$1" /etc/hosts && for keep in $4; do mkdir -p "$2$keep" && mount --bind "/tmp$keep" "$2$keep" || exit 1; done'
             ' && mount --rbind "$2" /tmp && hostname "$3" && shift 4 && exec "$@"')
KEPT = " ".join(sorted({"/" + p.relative_to("/tmp").as_posix() for p in (Path(__file__).resolve().parent.parent, BIN.parent)
                        if p.is_relative_to("/tmp")}))
UNSHARE = ["unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]

# Run in the head Pod, as a user's script there would: join the cluster this Pod's `ray start`
# wrote down, wait for every node, then one task pinned to each node.
DRIVER = """
import json, socket, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

expected = int(sys.argv[1])
ray.init(address="auto", logging_level="WARNING")
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < expected and time.monotonic() < deadline:
    time.sleep(0.5)
nodes = [n for n in ray.nodes() if n["Alive"]]

@ray.remote(num_cpus=1)
def where():
    return socket.gethostname()

refs = {n["NodeID"]: where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes}
ran = {node: ray.get(ref, timeout=60) for node, ref in refs.items()}
print("RESULT " + json.dumps({"alive": len(nodes), "driver_node": ray.get_runtime_context().get_node_id(), "ran": ran}), flush=True)
ray.shutdown()
"""


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "sh", "-c", "mount --bind /tmp /tmp && hostname probe"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def wired_pods(job_obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Pod of the job, as Volcano's controller makes it and the chain wires it."""
    pods = []
    for task in job_obj["spec"]["tasks"]:
        for index in range(task["replicas"]):
            job = read_workload(copy.deepcopy(job_obj))
            pods.append(Chain().mutate(job, make_pod(job, task["name"], index)).pod)
    return pods


def domain_name(pod: dict[str, Any]) -> str:
    return f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}"


class Pods:
    """The job's Pods as local processes; :meth:`stop` ends each one's whole process tree."""

    def __init__(self, root: Path, pods: list[dict[str, Any]]) -> None:
        self.root = root
        self.hosts = root / "hosts"
        lines = ["127.0.0.1 localhost"]
        lines += [f"127.0.0.{2 + k} {domain_name(pod)} {pod['spec']['hostname']}" for k, pod in enumerate(pods)]
        self.hosts.write_text("\n".join(lines) + "\n")
        self.processes: list[Process] = []

    def start(self, pod: dict[str, Any], extra_env: dict[str, str]) -> Process:
        """Start the Pod's one container's command in namespaces of its own."""
        (container,) = pod["spec"]["containers"]
        hostname = pod["spec"]["hostname"]
        pod_tmp = self.root / hostname
        pod_tmp.mkdir()
        argv = [*UNSHARE, "sh", "-c", ENTER_POD, "pod", str(self.hosts), str(pod_tmp), hostname, KEPT, *container["command"]]
        return self._start(hostname, argv, self.env(container, extra_env))

    def exec(self, process: Process, name: str, argv: list[str], env: dict[str, str]) -> Process:
        """Run ``argv`` in the namespaces of the Pod ``process`` runs, as ``kubectl exec`` does."""
        (init,) = Path(f"/proc/{process.popen.pid}/task/{process.popen.pid}/children").read_text().split()
        return self._start(name, ["nsenter", f"--target={init}", "--mount", "--uts", "--pid", "--", *argv], env)

    @staticmethod
    def env(container: dict[str, Any], extra_env: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "TMPDIR"}
        # svc's VC_* variables come from its ConfigMap (valueFrom), which Ray does not read.
        env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e}, **extra_env)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> Process:
        process = Process.start(name, argv, self.root / f"{name}.log", env=env)
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log(tail=30)}" for p in self.processes)

    def stop(self) -> None:
        # SIGKILL to unshare: --kill-child takes the Pod's PID 1 with it, and the kernel the rest.
        for process in self.processes:
            process.popen.kill()
        for process in self.processes:
            process.popen.wait(30)


def head_started(head: Process) -> bool:
    # A head that exits (a port taken, say) leaves the workers retrying it for good: stop here.
    assert head.alive, f"the head exited:\n{head.log(tail=30)}"
    return "Ray runtime started" in head.log()


@pytest.fixture
def short_root() -> Iterator[Path]:
    # Ray's Unix socket paths (session dir under each Pod's /tmp) are short as in a container, but
    # the Pod directories here must be short too: pytest's tmp_path can pass the 107-byte limit.
    root = Path(tempfile.mkdtemp(prefix="ray-pods-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_example_pods_form_one_ray_cluster(short_root):
    if not can_unshare():
        pytest.skip("needs unshare with mount, UTS and PID namespaces (root) to give each Pod its host name, /etc/hosts and /tmp")
    job_obj: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    ports = dict(zip(("port", "dashboardPort", "clientPort"), unused_ports(3), strict=True))
    job_obj["spec"]["plugins"]["ray"] = [f"--{flag}={number}" for flag, number in ports.items()]
    pods = wired_pods(job_obj)
    head, *workers = pods
    assert head["spec"]["containers"][0]["command"] == ["sh", "-c", (
        "ray start --head --block --dashboard-host=0.0.0.0 "
        f"--port={ports['port']} --dashboard-port={ports['dashboardPort']} --ray-client-server-port={ports['clientPort']}")]
    for worker in workers:
        assert worker["spec"]["containers"][0]["command"] == [
            "sh", "-c", f"ray start --block --address={domain_name(head)}:{ports['port']}"]

    template_env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(100 * 10**6)}
    local = Pods(short_root, pods)
    try:
        processes = [local.start(pod, template_env) for pod in pods]
        wait_until(lambda: head_started(processes[0]), 60, "the head to start", log=local.logs)
        driver = local.exec(processes[0], "driver", [str(BIN / "python"), "-c", DRIVER, str(len(pods))],
                            local.env(head["spec"]["containers"][0], template_env))
        try:
            driver.popen.wait(90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver did not finish in 90 s\n{local.logs()}")
        out = driver.log()
        assert driver.popen.returncode == 0, local.logs()
    finally:
        local.stop()
    (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["alive"] == len(pods), out
    assert sorted(result["ran"].values()) == sorted(pod["spec"]["hostname"] for pod in pods), out
    assert result["ran"][result["driver_node"]] == head["spec"]["hostname"], out
