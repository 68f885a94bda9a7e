"""The paddle plugin's environment, read by PaddlePaddle's own launcher's parser:
``paddle.distributed.launch.context.Context`` (what ``python -m paddle.distributed.launch train.py``
builds first) must take the job's master, node count, rank and id from each Pod's injected
environment. tests/on_node/test_jobs.py trains the example job with it on a whole Volcano. Needs the
``paddle`` extra (``pip install -e '.[paddle]'``, CPU); skipped without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.jobs import set_plugin_arg
from tests.helpers.wiring import injected_env
from volcano_job_webhook.plugins.builtin.paddle import RESERVED

launch_context = pytest.importorskip("paddle.distributed.launch.context")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "jobs" / "paddle-job.yaml"
MASTER = "paddle-demo-master-0.paddle-demo"


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
