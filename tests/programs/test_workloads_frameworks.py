"""The real frameworks start from an Indexed Job's and a JobSet's wired Pods (docs/workloads.md).

Each Pod of the example workload runs as a local process with its Pod's injected environment, only
the master's or coordinator's cluster DNS name swapped for loopback, to the end of training:
``torchrun`` across the Indexed Job's three Pods (the ``torch`` extra), JAX across the JobSet's five
(the ``jax`` extra). Skipped without the extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.envtest import free_port
from tests.helpers.jobs import set_plugin_arg
from tests.helpers.wiring import JAX_PROGRAM, injected_env
from volcano_job_webhook.plugins import read_workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workloads"


def run_all(commands: list[tuple[list[str], dict[str, str]]], cwd: Path) -> list[str]:
    procs = [subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for argv, env in commands]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out
            outputs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    return outputs


def test_torchrun_trains_across_an_indexed_jobs_pods(tmp_path):
    pytest.importorskip("torch.distributed.run")
    job_obj: dict[str, Any] = yaml.safe_load((EXAMPLES / "torchrun-indexed-job.yaml").read_text())
    port = free_port()
    set_plugin_arg(job_obj, "torchrun", "nproc-per-node", "1")
    set_plugin_arg(job_obj, "torchrun", "port", str(port))
    job = read_workload(job_obj)
    (task,) = job.tasks
    script = ROOT / "examples" / "torchrun" / "train.py"
    commands = []
    for index in range(task.replicas):
        injected = injected_env(job_obj, task.name, index, "PET_")
        assert injected["PET_MASTER_ADDR"] == "torchrun-indexed-0.torchrun-indexed"
        assert injected["PET_NODE_RANK"] == str(index) and injected["PET_NNODES"] == "3"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env.update(injected, PET_MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
        commands.append(([sys.executable, "-m", "torch.distributed.run", str(script)], env))
    outputs = run_all(commands, tmp_path)
    assert "(world size 3)" in outputs[0] and "done" in outputs[0], outputs[0]




def test_jax_forms_one_cluster_across_a_jobsets_pods(tmp_path):
    pytest.importorskip("jax")
    job_obj: dict[str, Any] = yaml.safe_load((EXAMPLES / "jax-jobset.yaml").read_text())
    job = read_workload(job_obj)
    port = free_port()
    pods = [(t.name, i) for t in job.tasks for i in range(t.replicas)]
    assert len(pods) == 5
    commands, ids = [], []
    for task, index in pods:
        injected = injected_env(job_obj, task, index, "JAX_")
        assert injected["JAX_COORDINATOR_ADDRESS"] == "jax-jobset-leader-0-0.jax-jobset:6666"
        ids.append(int(injected["JAX_PROCESS_ID"]))
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
        env.update(injected, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_PLATFORMS="cpu", TMPDIR=str(tmp_path))
        commands.append(([sys.executable, "-c", JAX_PROGRAM], env))
    assert sorted(ids) == list(range(5))
    joined = []
    for out in run_all(commands, tmp_path):
        line = next(line for line in out.splitlines() if line.startswith("JOINED "))
        _, index, count = line.split()
        assert int(count) == 5, out
        joined.append(int(index))
    assert joined == ids
