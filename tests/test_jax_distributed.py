"""The jax plugin's environment, read by JAX itself.

The example job's four Pods run as four local processes, each with its Pod's injected environment
(only the coordinator's cluster DNS name swapped for loopback). JAX reads
``JAX_COORDINATOR_ADDRESS`` on its own; the process count and id come from the plugin's variables.
Every process must join the one cluster with the id the plugin gave it. Needs the ``jax`` extra
(``pip install -e '.[jax]'``, CPU); skipped without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("jax")

from tests.envtest import free_port
from tests.wiring import JAX_PROGRAM, injected_env

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "jobs" / "jax-job.yaml"


def test_example_pods_form_one_jax_cluster(tmp_path):
    job_obj = yaml.safe_load(EXAMPLE.read_text())
    port = free_port()
    pods = [(t["name"], i) for t in job_obj["spec"]["tasks"] for i in range(t["replicas"])]
    procs = []
    for task, index in pods:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
        injected = injected_env(job_obj, task, index, "JAX_")
        assert injected["JAX_COORDINATOR_ADDRESS"] == "jax-demo-leader-0.jax-demo:6666"
        env.update(injected, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_PLATFORMS="cpu", TMPDIR=str(tmp_path))
        procs.append((injected, subprocess.Popen(
            [sys.executable, "-c", JAX_PROGRAM], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    try:
        outputs = [(injected, proc.communicate(timeout=240)[0], proc.returncode) for injected, proc in procs]
    finally:
        for _, proc in procs:
            proc.kill()
    joined = []
    for injected, out, code in outputs:
        assert code == 0, out
        line = next(line for line in out.splitlines() if line.startswith("JOINED "))
        _, index, count = line.split()
        assert (int(index), int(count)) == (int(injected["JAX_PROCESS_ID"]), len(pods)), out
        joined.append(int(index))
    assert sorted(joined) == list(range(len(pods)))
