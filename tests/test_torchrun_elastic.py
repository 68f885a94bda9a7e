"""Elastic torchrun from the torchrun plugin's environment: a node lost and replaced mid-training.

The example job (master 1, worker 2) with ``--min-nodes=2 --max-nodes=3 --max-restarts=3``: every
Pod gets ``PET_NNODES=2:3``, ``PET_RDZV_BACKEND=c10d``, ``PET_RDZV_ENDPOINT=<master Pod>:<port>``,
``PET_RDZV_ID`` (the job's uid), ``PET_MAX_RESTARTS=3`` and ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
(without it the replacement below waits for the trainers' store address until it times out: torch 2.13
publishes it only in the first round its rank 0 agent leads). Its three Pods run as three local
``torchrun`` agents (``python -m torch.distributed.run train.py``, nothing else on the command line),
each with its Pod's environment, only the master's cluster DNS name swapped for loopback, on a port
of :func:`tests.wiring.unused_ports`. The master starts first: in a cluster the c10d store is hosted
by the agent whose host matches the endpoint, the master Pod's; here every agent is on loopback,
so the first to bind the port hosts it, and the others connect to it.

The script all-reduces a step counter with gloo, checks the sum against the world size, and rank 0
saves the next step to a checkpoint file on storage all nodes share (as a volume would be), so a
restarted round resumes. Once a few steps are saved, worker 1's agent and its worker are killed
(SIGKILL to each process: a lost node). The other two agents' workers fail, and torchrun restarts
them into a new rendezvous round (one of ``--max-restarts``); a new agent with worker 1's environment
(what a replacement Pod gets) starts and joins it, the round closing at ``--max-nodes``. Training
then resumes from the checkpoint and ends on every live node with world size 3.

Needs the ``torch`` extra (``pip install -e '.[torch]'``); skipped without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch.distributed.run")

from tests.envtest import wait_until
from tests.jobs import set_plugin_arg
from tests.wiring import injected_env, unused_ports

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "jobs" / "torchrun-job.yaml"
STEPS = 40
KILL_AT = 6  # steps saved before worker 1 is lost
DEADLINE = 80.0  # seconds for the whole scenario

TRAIN = f"""
import os, time
import torch
import torch.distributed as dist

CHECKPOINT = os.environ["CHECKPOINT"]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = int(open(CHECKPOINT).read()) if os.path.exists(CHECKPOINT) else 0
print(f"JOINED rank={{rank}} world={{world}} start={{start}} restart={{os.environ['TORCHELASTIC_RESTART_COUNT']}}", flush=True)
for step in range({STEPS}):
    if step < start:
        continue
    total = torch.tensor([step + 1.0])
    dist.all_reduce(total)
    assert total.item() == world * (step + 1), (total.item(), world, step)
    if rank == 0:
        with open(CHECKPOINT + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(CHECKPOINT + ".tmp", CHECKPOINT)
    time.sleep(0.25)
dist.barrier()
print(f"DONE rank={{rank}} world={{world}}", flush=True)
dist.destroy_process_group()
"""


@dataclass
class Node:
    """One Pod's torchrun agent and its workers (a node)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """The agent and every process under it: its workers run in sessions of their own."""
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)


def descendants(pid: int) -> list[int]:
    """The processes under ``pid``, from /proc (children before their own children)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def elastic_job(port: int) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    for flag, value in (("nproc-per-node", 1), ("port", port), ("min-nodes", 2), ("max-nodes", 3), ("max-restarts", 3)):
        set_plugin_arg(obj, "torchrun", flag, value)
    return obj


def joined(node: Node) -> list[dict[str, int]]:
    """The training rounds ``node``'s worker joined: rank, world size, first step and torchrun's restart count."""
    return [{k: int(v) for k, v in (field.split("=") for field in line.split()[1:])}
            for line in node.output().splitlines() if line.startswith("JOINED ")]


def listening(port: int) -> bool:
    """Whether anything on this machine listens on TCP ``port`` (the c10d store)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def test_a_lost_node_is_replaced_and_training_resumes(tmp_path: Path) -> None:
    (port,) = unused_ports(1)
    obj = elastic_job(port)
    master_host = "torchrun-demo-master-0.torchrun-demo"
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    checkpoint = tmp_path / "shared" / "step"
    checkpoint.parent.mkdir()
    nodes: list[Node] = []
    started = time.monotonic()

    def start(name: str, task: str, index: int) -> Node:
        injected = injected_env(obj, task, index, "PET_")
        assert injected["PET_NNODES"] == "2:3" and injected["PET_RDZV_BACKEND"] == "c10d"
        assert injected["PET_RDZV_ENDPOINT"] == f"{master_host}:{port}" and injected["PET_MAX_RESTARTS"] == "3"
        assert injected["PET_RDZV_ID"] == obj["metadata"]["uid"]
        plain = injected_env(obj, task, index, "TORCH_")
        assert plain == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        injected.update(plain)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env.update(injected, PET_MASTER_ADDR="127.0.0.1", PET_RDZV_ENDPOINT=f"127.0.0.1:{port}",
                   CHECKPOINT=str(checkpoint), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", str(script)], cwd=tmp_path, env=env,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        node = Node(name, process, log)
        nodes.append(node)
        return node

    def wait(predicate: Callable[[], bool], what: str) -> None:
        # The waits share one budget, DEADLINE from ``started``: the scenario as a whole is bounded.
        def done() -> bool:
            if predicate():
                return True
            dead = [n.name for n in nodes if n.process.poll() not in (None, 0) and n.name != "worker-1"]
            assert not dead, f"{', '.join(dead)} exited while waiting for {what}"
            return False

        wait_until(done, DEADLINE - (time.monotonic() - started), what)

    def saved() -> int:
        try:
            return int(checkpoint.read_text())
        except (OSError, ValueError):
            return 0

    try:
        master = start("master-0", "master", 0)
        wait(lambda: listening(port), "the master's c10d store")
        start("worker-0", "worker", 0)
        lost = start("worker-1", "worker", 1)
        wait(lambda: saved() >= KILL_AT, f"{KILL_AT} steps saved by 3 nodes")
        assert all("world=3 start=0" in n.output() for n in nodes), "the first round has all three nodes"
        lost.kill()
        at_loss = saved()
        replacement = start("worker-1-replacement", "worker", 1)
        live = [master, nodes[1], replacement]
        wait(lambda: all(n.process.poll() is not None for n in live), "training to end on every live node")
        elapsed = time.monotonic() - started

        for node in live:
            assert node.process.returncode == 0, f"{node.name} exited {node.process.returncode}"
            rounds = joined(node)
            assert rounds[-1]["world"] == 3 and f"DONE rank={rounds[-1]['rank']} world=3" in node.output(), node.name
        for node in (master, nodes[1]):  # restarted by torchrun once the lost node's peer failed
            first, *_, last = joined(node)
            assert (first["start"], first["restart"]) == (0, 0) and last["restart"] >= 1 and last["start"] >= at_loss, node.name
        (only,) = joined(replacement)
        assert only["start"] >= at_loss, "the replacement resumed from the checkpoint"
        assert sorted(joined(n)[-1]["rank"] for n in live) == [0, 1, 2]
        assert saved() == STEPS
        print(f"lost at step {at_loss}, every live node done in {elapsed:.1f} s")
    except BaseException:
        for node in nodes:
            print(f"----- {node.name} (exit {node.process.poll()}) -----\n{node.output()[-6000:]}")
        raise
    finally:
        for node in nodes:
            node.kill()
