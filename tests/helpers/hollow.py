"""Hollow nodes: kubemark's ``--morph=kubelet`` (a real kubelet over a fake container runtime), as
many as asked, registered to an API server (../shared/real-kubernetes.md, "Many nodes on one
machine"), for the storms of tests/helpers/storm.py. Each node carries the label :data:`LABEL` and the taint
:data:`TAINT`, so only Pods that select and tolerate them land there (the storm's), and nothing of
the storm lands on the real node.

Hollow nodes stand for other machines, so they run at the lowest priority (``nice 19`` by default,
or ``SCHED_IDLE``): on two cores they would otherwise take CPU from the control plane and from the
webhook the storm measures, which on a real cluster they never share a core with. At the lowest
priority they get only what the rest leaves, so every CPU-second anyone else spends is theirs lost;
``own-core`` gives them the machine's last core instead, at normal priority (the kernel's balancer
then keeps the rest mostly on the other cores): the other way round, little of the rest reaches them.

Each runs in a mount namespace of its own whose ``/tmp`` is a directory of :attr:`HollowNodes.workdir`:
the hollow kubelet writes its root directory, volumes and its fake runtime's socket under ``/tmp``,
and all of it goes with that directory at :meth:`HollowNodes.stop`. Skips name ``KUBEMARK`` when it
is missing (:func:`kubemark_missing`).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.helpers.envtest import Process, free_port, request, wait_until

KUBEMARK_ENV = "KUBEMARK"
LABEL = ("vjw-storm/hollow", "true")
TAINT = f"{LABEL[0]}={LABEL[1]}:NoSchedule"
NODE_SELECTOR = {LABEL[0]: LABEL[1]}
TOLERATION = {"key": LABEL[0], "operator": "Equal", "value": LABEL[1], "effect": "NoSchedule"}
PRIORITIES = ("nice", "idle", "normal", "own-core")
BATCH = 10  # hollow nodes started at once: fifty together can outrun the API server's registrations


def find_kubemark(environ: Mapping[str, str] = os.environ) -> Path | None:
    value = environ.get(KUBEMARK_ENV)
    if value and os.access(value, os.X_OK) and Path(value).is_file():
        return Path(value)
    return None


def kubemark_missing(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why hollow nodes cannot run here (None when they can)."""
    if find_kubemark(environ) is None:
        return (f"{KUBEMARK_ENV} is not set to an executable kubemark (cmd/kubemark of the same Kubernetes tree as "
                "the node's parts: ../shared/real-kubernetes.md, 'Many nodes on one machine')")
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return None


def self_contained(kubeconfig: Path) -> dict[str, Any]:
    """``kubeconfig`` with its CA file inlined (``certificate-authority-data``): readable from a
    mount namespace where the file's directory is hidden."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        cluster = entry["cluster"]
        path = cluster.pop("certificate-authority", None)
        if path:
            cluster["certificate-authority-data"] = base64.b64encode(Path(path).read_bytes()).decode()
    return config


def priority_prefix(priority: str) -> list[str]:
    """The command that starts a process at ``priority``: ``nice`` (19), ``idle`` (SCHED_IDLE), ``normal``,
    ``own-core`` (normal, on the last core only)."""
    if priority == "own-core":
        return ["taskset", "-c", str((os.cpu_count() or 1) - 1)]
    if priority == "nice":
        return ["nice", "-n", "19"]
    if priority == "idle":
        return ["chrt", "--idle", "0"]
    if priority == "normal":
        return []
    raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}")


@dataclass
class HollowNodes:
    """``count`` hollow nodes ``hollow-0`` … against the API server of ``kubeconfig`` (a
    ``system:masters`` user: the Node authorizer's checks are the real node's business), each
    taking up to ``max_pods``."""

    binary: Path
    kubeconfig: Path
    workdir: Path
    count: int
    max_pods: int = 250
    priority: str = "nice"
    prefix: str = "hollow"
    processes: dict[str, Process] = field(default_factory=dict, init=False)
    restarted: int = field(default=0, init=False)  # nodes started again (a CSINode given up)

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.count)]

    def start(self, api: client.ApiClient, timeout: float = 120.0) -> HollowNodes:
        """Start the nodes :data:`BATCH` at a time, each batch once Ready, and return once all are;
        on failure, stop them. A kubelet that gave up initialising its CSINode while the API server
        was slow to register it stays NotReady for good: such a node is started again."""
        try:
            tmp = self.workdir / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "kubeconfig").write_text(yaml.safe_dump(self_contained(self.kubeconfig)))
            (tmp / "kubeconfig").chmod(0o600)
            names = self.names
            for first in range(0, len(names), BATCH):
                for name in names[first:first + BATCH]:
                    self._start_one(name)
                self.wait_ready(api, timeout, names[:first + BATCH])
        except BaseException:
            self.stop(api)
            raise
        return self

    def _start_one(self, name: str) -> None:
        argv = [
            "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /tmp && exec "$@"', str(self.workdir / "tmp"),
            *priority_prefix(self.priority), str(self.binary), "--morph=kubelet", f"--name={name}",
            "--kubeconfig=/tmp/kubeconfig", f"--kubelet-port={free_port()}", "--kubelet-read-only-port=0",
            "--use-host-image-service=false", f"--max-pods={self.max_pods}",
            f"--node-labels={LABEL[0]}={LABEL[1]}", f"--register-with-taints={TAINT}",
            # Above kubelet's 10 a second: a node starting a hundred Pods reports each one's status.
            "--kube-api-qps=50", "--kube-api-burst=100", "-v=1",
        ]
        self.processes[name] = Process.start(name, argv, self.workdir / f"{name}.log")

    def _conditions(self, api: client.ApiClient) -> dict[str, dict[str, Any] | None]:
        """Each registered hollow node's Ready condition, by name."""
        nodes = request(api, "GET", "/api/v1/nodes", query=[("labelSelector", f"{LABEL[0]}={LABEL[1]}")])["items"]
        return {n["metadata"]["name"]: next((c for c in (n.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)
                for n in nodes}

    def ready(self, api: client.ApiClient) -> list[str]:
        """The names of the hollow nodes registered and Ready now."""
        return [name for name, ready in self._conditions(api).items() if ready and ready["status"] == "True" and name in self.processes]

    def wait_ready(self, api: client.ApiClient, timeout: float = 120.0, names: list[str] | None = None) -> None:
        """Until ``names`` (all) are Ready, starting again any whose kubelet gave up on its CSINode."""
        wanted = set(names or self.names)
        restarts: dict[str, int] = {}

        def all_ready() -> bool:
            for process in self.processes.values():
                process.running()
            conditions = self._conditions(api)
            for name in wanted:
                ready = conditions.get(name)
                if ready and ready["status"] != "True" and "CSINode" in ready.get("message", "") and restarts.get(name, 0) < 3:
                    restarts[name] = restarts.get(name, 0) + 1
                    self.processes.pop(name).stop(grace=1.0)
                    self._start_one(name)
            return all((conditions.get(n) or {}).get("status") == "True" for n in wanted)

        wait_until(all_ready, timeout, f"{len(wanted)} hollow nodes Ready", interval=0.5, log=lambda: self.not_ready(api))
        self.restarted += sum(restarts.values())

    def not_ready(self, api: client.ApiClient) -> str:
        """Each hollow node not Ready and why (its Ready condition, or that it is not registered)."""
        nodes = {n["metadata"]["name"]: n for n in request(api, "GET", "/api/v1/nodes",
                                                           query=[("labelSelector", f"{LABEL[0]}={LABEL[1]}")])["items"]}
        out = []
        for name in self.names:
            node = nodes.get(name)
            ready = next((c for c in (node or {}).get("status", {}).get("conditions") or [] if c["type"] == "Ready"), None)
            if ready is None or ready["status"] != "True":
                out.append(f"{name}: {'not registered' if node is None else ready}")
        return "\n".join(out)

    def restart(self, api: client.ApiClient, timeout: float = 120.0) -> None:
        """New processes under the same names (an empty runtime each, a fresh /tmp)."""
        self._kill()
        self._clear_tmp()
        self.start(api, timeout)

    def pids(self) -> Iterator[int]:
        for process in self.processes.values():
            if process.alive:
                yield process.popen.pid

    def rss_mib(self) -> list[float]:
        """Each running node's resident memory (MiB)."""
        return [rss / 2**20 for pid in self.pids() if (rss := process_rss(pid)) is not None]

    def cpu_seconds(self) -> float:
        """CPU seconds the running nodes have used so far (user + system)."""
        return sum(process_cpu_seconds(pid) or 0.0 for pid in self.pids())

    def _kill(self) -> None:
        for process in self.processes.values():
            if process.alive:
                process.popen.send_signal(signal.SIGKILL)
        for process in self.processes.values():
            process.popen.wait()
        self.processes.clear()

    def _clear_tmp(self) -> None:
        tmp = self.workdir / "tmp"
        for entry in tmp.iterdir() if tmp.exists() else ():
            if entry.name != "kubeconfig":
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)

    def stop(self, api: client.ApiClient | None = None) -> None:
        """Kill every node (nothing of a hollow node needs a graceful end), delete their Node objects
        when ``api`` is given, and remove their files."""
        self._kill()
        if api is not None:
            for name in self.names:
                try:
                    request(api, "DELETE", f"/api/v1/nodes/{name}")
                except Exception:  # gone already, or the API server is away: nothing of the machine's is left
                    pass
        shutil.rmtree(self.workdir / "tmp", ignore_errors=True)

    def leftovers(self) -> list[str]:
        alive = [f"process {p.name} ({p.popen.pid})" for p in self.processes.values() if p.alive]
        return alive + ([str(self.workdir / "tmp")] if (self.workdir / "tmp").exists() else [])


def process_rss(pid: int) -> int | None:
    """Resident bytes of a process (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def process_peak_rss(pid: int) -> int | None:
    """The most a process has held resident (``VmHWM``), bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_schedstat(pid: int) -> tuple[float, float] | None:
    """``(on a CPU, runnable but waiting for one)`` seconds of a process so far, its threads summed
    (``/proc/PID/task/*/schedstat``; a thread that has ended no longer counts)."""
    run = wait = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        run, wait = run + int(run_ns), wait + int(wait_ns)
    return run / 1e9, wait / 1e9
