"""The torchrun plugin's environment, read by torchrun itself.

``torch.distributed.run`` takes every command-line option from a ``PET_<OPTION>`` variable when the
option is not given; its parser reads the environment when it is built. Here the injected
environment of the example job's master and worker Pods goes to that parser and to
``config_from_args`` (what ``torchrun train.py`` runs), and the launch configuration must be the
job's. Needs the ``torch`` extra (``pip install -e '.[torch]'``: PyTorch 2.13.0, CPU); skipped
without it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

torch_run = pytest.importorskip("torch.distributed.run")

from tests.helpers.wiring import injected_env  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "torchrun-job.yaml"
ANNOTATION = "volcano-job-webhook/plugins"


def example_job(**torchrun_args: str) -> dict[str, Any]:
    """The example job as the API server holds it (a uid of its own: the file names none), with extra
    ``--flag=value`` arguments for the torchrun plugin."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"]["uid"] = "5b0f6c1e-7d3a-4c2e-9a51-0c3d2e1f4a6b"
    plugins = json.loads(obj["metadata"]["annotations"][ANNOTATION])
    plugins["torchrun"] += [f"--{flag.replace('_', '-')}={value}" for flag, value in torchrun_args.items()]
    obj["metadata"]["annotations"][ANNOTATION] = json.dumps(plugins)
    return obj


def launch(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """What ``torchrun train.py`` makes of ``env``: the parsed arguments and the launch config."""
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args sets it otherwise
    args = torch_run.get_args_parser().parse_args(["train.py"])
    config, entrypoint, script_args = torch_run.config_from_args(args)
    assert (entrypoint, script_args) == (sys.executable, ["-u", "train.py"])
    return args, config


@pytest.mark.parametrize(("task", "index", "rank"), [("master", 0, 0), ("worker", 0, 1), ("worker", 1, 2)])
def test_static_rendezvous_from_the_injected_environment(task, index, rank, monkeypatch):
    env = injected_env(example_job(), task, index, "PET_")
    args, config = launch(env, monkeypatch)

    assert (config.min_nodes, config.max_nodes) == (3, 3)  # 1 master + 2 workers
    assert args.node_rank == rank
    assert config.rdzv_configs["rank"] == rank
    assert config.nproc_per_node == 2  # auto: the template's CPU limit of "2", no GPU
    assert (args.master_addr, args.master_port) == ("torchrun-demo-master-0.torchrun-demo", 29500)
    assert config.rdzv_backend == "static"
    assert config.rdzv_endpoint == "torchrun-demo-master-0.torchrun-demo:29500"
    assert config.max_restarts == 0


@pytest.mark.parametrize(("task", "index"), [("master", 0), ("worker", 1)])
def test_elastic_rendezvous_from_the_injected_environment(task, index, monkeypatch):
    job_obj = example_job(min_nodes="2", max_nodes="4", max_restarts="3", nproc_per_node="1", port="23456")
    env = injected_env(job_obj, task, index, "PET_")
    args, config = launch(env, monkeypatch)

    assert (config.min_nodes, config.max_nodes) == (2, 4)
    assert config.nproc_per_node == 1
    assert config.rdzv_backend == "c10d"
    assert config.rdzv_endpoint == "torchrun-demo-master-0.torchrun-demo:23456"
    assert config.run_id == job_obj["metadata"]["uid"]
    assert config.max_restarts == 3
    assert args.master_port == 23456


def test_gpu_limit_sets_processes_per_node(monkeypatch):
    job_obj = example_job()
    for task in job_obj["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 4
    _, config = launch(injected_env(job_obj, "worker", 0, "PET_"), monkeypatch)
    assert config.nproc_per_node == 4
