"""torchrun, hostfile, jax, xgboost, paddle and waitfor through the server and the CLI: ``/validate`` checks their arguments at
``kubectl apply`` time, ``/mutate`` denies a Pod of a job that gets them wrong with the same message,
and the CLI shows their side resources. (Their Pod changes are in ``fixtures/plugins/spec``.)"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jsonpatch
import pytest
import yaml

from tests.helpers.jobs import annotate, loaded
from tests.helpers.paths import EXAMPLES
from tests.helpers.schema import validate_object, validate_pod
from volcano_job_webhook.cli import main
from volcano_job_webhook.plugins import Job
from volcano_job_webhook.plugins.keys import VOLCANO_PLUGINS
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.registry import BUILTINS
from volcano_job_webhook.server.admission import admission_review

pytestmark = pytest.mark.anyio


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / "jobs" / f"{name}-job.yaml").read_text())


def pod_review(job: dict, task: str, index: int) -> dict:
    return admission_review(make_pod(Job.from_object(job), task, index), uid=f"{task}-{index}")


async def answer(client, review: dict, path: str) -> dict:
    reply = await client.post(path, json=review)
    assert reply.status_code == 200, reply.text
    return reply.json()["response"]


def reserved(name: str, task: int, variable: str) -> dict:
    """The example job with a pod template that sets a variable the plugin owns."""
    job = example(name)
    job["metadata"]["name"] = "reserved"
    job["spec"]["tasks"][task]["template"]["spec"]["containers"][0]["env"] = [{"name": variable, "value": "7"}]
    return job


def broken_torchrun() -> dict:
    job = example("torchrun")
    job["metadata"]["name"] = "reserved"
    job["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["env"] = [{"name": "PET_NODE_RANK", "value": "7"}]
    return job


@pytest.mark.parametrize(
    ("make_job", "message"),
    [
        (
            broken_torchrun,
            "job default/reserved: plugin torchrun: spec.tasks[1].template.spec.containers[0].env[0]: PET_NODE_RANK is reserved",
        ),
        (
            lambda: annotate(example("hostfile"), {"hostfile": ["--master=mpimaster", "--format=slurm"]}),
            "job default/hostfile-demo: plugin hostfile: --format: must be one of openmpi, intel, mpich, deepspeed, got 'slurm'",
        ),
        (
            lambda: annotate(example("jax"), {"jax": ["--coordinator=head"]}),
            "job default/jax-demo: plugin jax: --coordinator: the job has no task 'head'; did you mean 'leader'? (tasks: leader, worker)",
        ),
        (
            lambda: annotate(example("torchrun"), {"torchrun": ["--min-nodes=4", "--max-nodes=2"]}),
            "job default/torchrun-demo: plugin torchrun: --min-nodes: 4 is more than --max-nodes 2",
        ),
        (
            lambda: reserved("xgboost", 1, "DMLC_NUM_WORKER"),
            "job default/reserved: plugin xgboost: spec.tasks[1].template.spec.containers[0].env[0]: DMLC_NUM_WORKER is reserved",
        ),
        (
            lambda: annotate(example("xgboost"), {"xgboost": ["--tracker=chief"]}),
            "job default/xgboost-demo: plugin xgboost: --tracker: the job has no task 'chief' (tasks: master, worker)",
        ),
        (
            lambda: reserved("paddle", 0, "PADDLE_TRAINER_ID"),
            "job default/reserved: plugin paddle: spec.tasks[0].template.spec.containers[0].env[0]: PADDLE_TRAINER_ID is reserved",
        ),
        (
            lambda: annotate(example("paddle"), {"paddle": ["--port=-1"]}),
            "job default/paddle-demo: plugin paddle: --port: invalid value '-1': -1 is outside 1..65535",
        ),
        (
            lambda: annotate(example("waitfor"), {"waitfor": ["--tasks=mpiworker", "--waiters=mpiworker"]}),
            "job default/waitfor-demo: plugin waitfor: --waiters: task 'mpiworker' would wait for its own Pods",
        ),
    ],
    ids=[
        "torchrun-reserved-env", "hostfile-format", "jax-coordinator", "torchrun-bounds",
        "xgboost-reserved-env", "xgboost-tracker", "paddle-reserved-env", "paddle-port", "waitfor-self-wait",
    ],
)
async def test_bad_arguments_are_denied_at_apply_and_at_admission(client, jobs_dir, make_job, message):
    job = make_job()
    verdict = await answer(client, admission_review(job, uid="v"), "/validate")
    assert verdict["allowed"] is False and verdict["status"]["code"] == 403
    assert verdict["status"]["message"].startswith(message)

    (jobs_dir / f"{job['metadata']['name']}-job.yaml").write_text(yaml.safe_dump(job))
    await loaded(client.source)  # a changed file is read in the background; an unchanged name is served until then
    task = job["spec"]["tasks"][-1]["name"]
    denied = await answer(client, pod_review(job, task, 0), "/mutate")
    assert denied["allowed"] is False and denied["status"]["message"] == verdict["status"]["message"]


@pytest.mark.parametrize("name", [name for name in BUILTINS if name not in VOLCANO_PLUGINS])
async def test_examples_are_admitted_and_wired(client, name):
    job = example(name)
    verdict = await answer(client, admission_review(job, uid="v"), "/validate")
    assert verdict["allowed"] is True, verdict
    for task in job["spec"]["tasks"]:
        response = await answer(client, pod_review(job, task["name"], task["replicas"] - 1), "/mutate")
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
        pod = pod_review(job, task["name"], task["replicas"] - 1)["request"]["object"]
        wired = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        validate_pod(wired)
        env = {e["name"] for c in wired["spec"]["containers"] for e in c.get("env", [])}
        assert env & {"PET_NODE_RANK", "JAX_PROCESS_ID", "MPI_HOST", "VC_WORKER_NUM", "VC_MPIWORKER_NUM", "DMLC_TASK_ID", "PADDLE_RANK"}, env


def test_cli_resources_shows_the_host_file(capsys):
    code = main(["resources", "--job", str(EXAMPLES / "jobs" / "hostfile-job.yaml"), "-o", "json"])
    out, _ = capsys.readouterr()
    assert code == 0
    objects = json.loads(out)
    objects = objects["items"] if isinstance(objects, dict) else objects
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    hostfile = by_name[("ConfigMap", "hostfile-demo-hostfile")]
    validate_object(hostfile)
    assert hostfile["data"] == {
        "hostfile": "hostfile-demo-worker-0.hostfile-demo slots=2\nhostfile-demo-worker-1.hostfile-demo slots=2\n"
    }


def test_cli_bad_argument_exits_2_naming_job_plugin_and_flag(capsys, tmp_path: Path):
    job = annotate(example("jax"), {"jax": ["--port=coord"]})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    code = main(["mutate", "--job", str(path), "--task", "worker"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "job default/jax-demo: plugin jax: --port: invalid value 'coord'" in err


@pytest.mark.parametrize(
    ("defaults", "port"),
    [({}, "29500"), ({"pytorch": ["--port=4000"]}, "4000"), ({"pytorch": []}, "23456")],
    ids=["no-pytorch", "server-default-pytorch-port", "pytorch-default-port"],
)
def test_torchrun_port_follows_the_pytorch_plugin_the_chain_runs(defaults, port):
    """The chain's view counts: a pytorch plugin the server adds to every job moves the default too."""
    from volcano_job_webhook.plugins import Chain, ChainConfig

    job = Job.from_object(example("torchrun"))
    pod = Chain(config=ChainConfig(defaults=defaults)).mutate(job, make_pod(job, "worker", 0)).pod
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_MASTER_PORT"] == port
    if defaults:
        assert env["MASTER_PORT"] == port


@pytest.mark.parametrize(
    ("text", "value"),
    [(4, "4"), ("3500m", "3.5"), ("2.5", "2.5"), ("1k", "1000"), ("1Ki", "1024"), ("1e3", "1000"), (".5", "0.5"), ("100u", "0.0001")],
)
def test_quantities_as_kubernetes_reads_them(text, value):
    from decimal import Decimal

    from volcano_job_webhook.plugins.builtin.quantity import parse_quantity

    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize(("text", "message"), [
    ("two", "'two' is not a Kubernetes quantity"), ("-1", "'-1' is negative"), ("1KB", "'1KB' is not a Kubernetes quantity"),
    ("", "'' is not a Kubernetes quantity"), ("1.2.3", "'1.2.3' is not a Kubernetes quantity"),
    (True, "True is not a quantity"), (None, "None is not a quantity"), ("1 k", "'1 k' is not a Kubernetes quantity"),
])
def test_malformed_quantities_are_refused(text, message):
    from volcano_job_webhook.plugins.builtin.quantity import parse_quantity

    with pytest.raises(ValueError) as refused:
        parse_quantity(text)
    assert str(refused.value) == message
