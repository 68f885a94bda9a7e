"""The paddle plugin's environment, read by PaddlePaddle's own launcher.

First its parser: ``paddle.distributed.launch.context.Context`` (what ``python -m
paddle.distributed.launch train.py`` builds first) must take the job's master, node count, rank and id
from each Pod's injected environment. Then the real thing: the example job's three Pods run
``python -m paddle.distributed.launch examples/paddle/train.py`` as three local launchers, each with
its Pod's environment, and must form one collective job that trains one model.

Only the master's cluster DNS name is swapped, for 127.0.0.2: loopback, but not the address the
launcher treats as its own (127.0.0.1 or the host's IP), so the workers stay clients of the master's
rendezvous server as they are in the cluster. The master Pod's own ``PADDLE_MASTER`` is already
loopback and runs unchanged; the port moves to a free one through the plugin's ``--port``. Needs the
``paddle`` extra (``pip install -e '.[paddle]'``, CPU); skipped without it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.envtest import free_port
from tests.jobs import set_plugin_arg
from tests.wiring import injected_env
from volcano_job_webhook.plugins.builtin.paddle import RESERVED

launch_context = pytest.importorskip("paddle.distributed.launch.context")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "jobs" / "paddle-job.yaml"
SCRIPT = EXAMPLES / "paddle" / "train.py"
MASTER = "paddle-demo-master-0.paddle-demo"
PODS = [("master", 0), ("worker", 0), ("worker", 1)]
RESULT = re.compile(r"^rank (\d+)/(\d+): loss ([\d.]+) -> ([\d.]+), weights (\S+)$", re.MULTILINE)


def example_job(port: int | None = None) -> dict[str, Any]:
    obj = yaml.safe_load(EXAMPLE.read_text())
    if port is not None:
        set_plugin_arg(obj, "paddle", "port", port)
    return obj


def clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_") and k not in RESERVED and k != "POD_IP"}


def test_reserved_names_are_the_launchers_own():
    from paddle.distributed.launch.context.args_envs import env_args_mapping

    set_by_plugin = {"PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_JOB_ID", "PADDLE_RANK"}
    assert {name: env_args_mapping[name][0] for name in set_by_plugin} == {
        "PADDLE_MASTER": "master", "PADDLE_NNODES": "nnodes", "PADDLE_JOB_ID": "job_id", "PADDLE_RANK": "rank",
    }
    assert set_by_plugin <= RESERVED


@pytest.mark.parametrize(("task", "index", "rank", "master"), [
    ("master", 0, 0, "127.0.0.1:6768"), ("worker", 0, 1, f"{MASTER}:6768"), ("worker", 1, 2, f"{MASTER}:6768"),
])
def test_the_launcher_parses_the_injected_environment(task, index, rank, master, monkeypatch):
    env = injected_env(example_job(), task, index, "PADDLE_")
    for name in list(os.environ):
        if name not in clean_environ():
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["launch", "train.py"])

    ctx = launch_context.Context()

    assert ctx.args.master == master
    assert int(ctx.args.nnodes) == 3
    assert ctx.args.rank == rank
    assert ctx.args.job_id == "paddle-demo"
    assert ctx.args.training_script == "train.py"
    assert not ctx.is_legacy_mode()  # the master given: the collective controller, not the old launcher


def test_example_pods_form_one_collective_job(tmp_path):
    port = free_port()
    job_obj = example_job(port)
    procs = []
    for task, index in PODS:
        injected = injected_env(job_obj, task, index, "PADDLE_")
        env = clean_environ()
        env.update(injected, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
        if (task, index) == ("master", 0):
            assert injected["PADDLE_MASTER"] == f"127.0.0.1:{port}"
        else:
            assert injected["PADDLE_MASTER"] == f"{MASTER}:{port}"
            env["PADDLE_MASTER"] = f"127.0.0.2:{port}"
        workdir = tmp_path / f"{task}-{index}"
        workdir.mkdir()
        procs.append((task, index, injected, workdir, subprocess.Popen(
            [sys.executable, "-m", "paddle.distributed.launch", str(SCRIPT)],
            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    try:
        outputs = [(task, index, injected, workdir, proc.communicate(timeout=300)[0], proc.returncode)
                   for task, index, injected, workdir, proc in procs]
    finally:
        for *_, proc in procs:
            proc.kill()

    weights = set()
    for task, index, injected, workdir, out, code in outputs:
        assert code == 0, f"{task}-{index}:\n{out}"
        trainer_log = (workdir / "log" / "workerlog.0").read_text()
        (found,) = RESULT.findall(trainer_log)
        rank, world, first_loss, last_loss, final = found
        assert int(rank) == int(injected["PADDLE_RANK"]), trainer_log
        assert int(world) == len(PODS) == int(injected["PADDLE_NNODES"]), trainer_log
        assert float(last_loss) < float(first_loss) / 4, trainer_log
        weights.add(final)
    assert len(weights) == 1, f"the ranks ended with different weights: {weights}"
