"""The offline CLI: mutate, resources and review, and their exit codes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.jobs import loaded
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.cli import main

PLUGIN_TASKS = {
    "env": "worker", "svc": "worker", "ssh": "node", "pytorch": "worker",
    "tensorflow": "worker", "mpi": "mpimaster", "ray": "worker", "hcclrank": "worker",
    "torchrun": "worker", "hostfile": "mpimaster", "jax": "worker", "xgboost": "worker", "paddle": "worker", "waitfor": "mpimaster",
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("plugin", sorted(PLUGIN_TASKS))
def test_mutate_is_idempotent_on_its_own_output(capsys, tmp_path, plugin):
    job = str(EXAMPLES / "jobs" / f"{plugin}-job.yaml")
    task = next(t for t in yaml.safe_load(Path(job).read_text())["spec"]["tasks"] if t["name"] == PLUGIN_TASKS[plugin])
    index = min(1, task["replicas"] - 1)  # the second Pod, where the task has one
    code, out, _ = run(capsys, "mutate", "--job", job, "--task", PLUGIN_TASKS[plugin], "--index", str(index))
    assert code == 0
    wired = json.loads(out)
    (tmp_path / "pod.json").write_text(out)
    code, again, _ = run(capsys, "mutate", "--job", job, str(tmp_path / "pod.json"))
    assert code == 0 and json.loads(again) == wired
    code, patch, _ = run(capsys, "mutate", "--job", job, str(tmp_path / "pod.json"), "--patch")
    assert code == 0 and json.loads(patch) == []


def test_mutate_reads_the_pod_from_stdin_and_prints_a_patch(capsys, monkeypatch):
    review = json.loads((EXAMPLES / "admission" / "env-pod.json").read_text())
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(yaml.safe_dump(review["request"]["object"])))
    code, out, _ = run(capsys, "mutate", "--job", str(EXAMPLES / "jobs" / "env-job.yaml"), "-", "--patch")
    assert code == 0
    assert json.loads(out) == [
        {"op": "add", "path": "/spec/containers/0/env", "value": [
            {"name": "VK_TASK_INDEX", "value": "1"}, {"name": "VC_TASK_INDEX", "value": "1"}]},
    ]


def test_resources_yaml_and_json(capsys):
    job = str(EXAMPLES / "jobs" / "mpi-job.yaml")
    code, out, _ = run(capsys, "resources", "--job", job)
    assert code == 0
    objects = list(yaml.safe_load_all(out))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Secret", "mpi-demo-ssh"), ("ConfigMap", "mpi-demo-svc"), ("Service", "mpi-demo"), ("NetworkPolicy", "mpi-demo"),
    ]
    assert objects[1]["data"]["mpiworker.host"] == "mpi-demo-mpiworker-0.mpi-demo\nmpi-demo-mpiworker-1.mpi-demo"
    code, out2, _ = run(capsys, "resources", "--job", job, "-o", "json")
    second = json.loads(out2)
    # Keys are fresh on every run; everything else is the same.
    assert base64.b64decode(second[0]["data"]["id_rsa"]) != base64.b64decode(objects[0]["data"]["id_rsa"])
    for obj in (objects[0], second[0]):
        for key in ("id_rsa", "id_rsa.pub", "authorized_keys"):
            obj["data"].pop(key)
    assert second == objects


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mutate", "--job", "/nonexistent.yaml", "--task", "w"], "/nonexistent.yaml: cannot read"),
        (["mutate", "--job", str(EXAMPLES / "jobs" / "pytorch-job.yaml")], "give a POD file, or --task"),
        (["mutate", "--job", str(EXAMPLES / "jobs" / "env-job.yaml"), "--task", "nope"], "job default/env-demo: task: the job has no task 'nope'"),
        (["resources", "--job", str(EXAMPLES / "admission" / "env-pod.json")], "expected one Job or JobSet, found: AdmissionReview"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_bad_plugin_argument_names_job_plugin_and_argument(capsys, tmp_path):
    # In our annotation: ``resources`` shows what the reconciler makes, which leaves spec.plugins
    # (and whatever is wrong with them) to Volcano's controller.
    job = yaml.safe_load((EXAMPLES / "jobs" / "ray-job.yaml").read_text())
    del job["spec"]["plugins"]
    job["metadata"]["annotations"] = {"volcano-job-webhook/plugins": json.dumps({"ray": ["--clientport=1"]})}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    code, _, err = run(capsys, "resources", "--job", str(tmp_path / "job.yaml"))
    assert code == 2
    assert err.startswith("volcano-webhook resources: job default/ray-demo: plugin ray: --clientport: flag provided but not defined")


def test_console_script_runs():
    done = subprocess.run(
        [sys.executable, "-m", "volcano_job_webhook", "review", "--job", str(EXAMPLES / "jobs" / "env-job.yaml"), "--task", "worker"],
        capture_output=True, text=True, check=True,
    )
    review = json.loads(done.stdout)
    assert review["request"]["object"]["metadata"]["name"] == "env-demo-worker-0"


# Hostile inputs: each is exit 2 and one line, never a traceback, a signal or a hang -----------------


def job_with_replicas(tmp_path, replicas: int) -> str:
    obj = yaml.safe_load((EXAMPLES / "jobs" / "mpi-job.yaml").read_text())
    for task in obj["spec"]["tasks"]:
        task["replicas"] = replicas
    path = tmp_path / f"job-{replicas}.yaml"
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def billion_laughs(tmp_path) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = (EXAMPLES / "jobs" / "env-job.yaml").read_text().replace(
        "        spec:\n          restartPolicy", "        metadata:\n          labels:\n"
        + "".join(f"            {line}\n" for line in lines) + "        spec:\n          restartPolicy")
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    return str(path)


def cli(*argv: str, stdin=subprocess.DEVNULL, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "volcano_job_webhook", *argv], stdin=stdin, capture_output=True,
                          text=True, timeout=timeout)


def refused(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert (done.returncode, done.stdout) == (2, ""), done.stderr[-500:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr and message in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mutate", "--job", "/dev/zero", "--task", "w"], "/dev/zero: not a regular file"),
        (["resources", "--job", "/dev/zero"], "/dev/zero: not a regular file"),
        (["mutate", "--job", "BOMB", "--task", "worker"], "refused: YAML aliases would add more than 100000 nodes"),
        (["review", "--job", "BOMB", "--task", "worker"], "refused: YAML aliases would add more than 100000 nodes"),
        (["resources", "--job", "BOMB"], "refused: YAML aliases would add more than 100000 nodes"),
        (["resources", "--job", "BILLION"], "job default/mpi-demo: spec.tasks: 2000000000 replicas in all, over the 150000 the offline commands build"),
        (["review", "--job", "BILLION", "--task", "mpiworker"], "2000000000 replicas in all"),
        (["mutate", "--job", "BILLION", "--task", "mpiworker"], "2000000000 replicas in all"),
        (["resources", "--job", "MILLION"], "job default/mpi-demo: spec.tasks: 2000000 replicas in all"),
        (["mutate", "--job", "DEEP", "--task", "w"], "refused: nested more than 100 levels deep"),
        (["resources", "--job", "HUGE"], "larger than the limit of 4194304 bytes"),
        (["resources", "--job", "FIFO"], "FIFO: not a regular file"),
    ],
)
def test_hostile_files_exit_2_with_one_line(tmp_path, argv, message):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: a plain open() would wait for ever
    (tmp_path / "deep.json").write_text('{"kind": "Job", "spec": ' + "[" * 5000 + "]" * 5000 + "}")
    (tmp_path / "huge.yaml").write_text("# " + "x" * (4 * 1024 * 1024))
    names = {"BOMB": billion_laughs(tmp_path), "BILLION": job_with_replicas(tmp_path, 10**9),
             "MILLION": job_with_replicas(tmp_path, 10**6), "DEEP": str(tmp_path / "deep.json"),
             "HUGE": str(tmp_path / "huge.yaml"), "FIFO": str(fifo)}
    refused(cli(*[names.get(arg, arg) for arg in argv]), message.replace("FIFO", str(fifo)))


def test_standard_input_that_never_ends_is_cut_at_the_size_limit():
    endless = subprocess.Popen([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('a: b\\n' * 1000)"],
                               stdout=subprocess.PIPE)
    try:
        refused(cli("resources", "--job", "-", stdin=endless.stdout), "-: larger than the limit of 4194304 bytes")
    finally:
        endless.kill()
        endless.wait()


def test_a_terminal_on_standard_input_is_refused():
    import pty

    parent, child = pty.openpty()
    try:
        refused(cli("resources", "--job", "-", stdin=child), "-: standard input is a terminal")
    finally:
        os.close(parent)
        os.close(child)


def test_standard_input_that_goes_silent_is_given_up(monkeypatch):
    from volcano_job_webhook.documents import DocumentError, read_stdin

    read_end, write_end = os.pipe()
    os.write(write_end, b"kind: Job\n")  # a start, then nothing, and never closed
    with os.fdopen(read_end) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(DocumentError, match=r"nothing read from standard input for 0\.2 s"):
            read_stdin(idle=0.2)
    os.close(write_end)


def unordered(value: object) -> object:
    """``value`` with every list of named entries (env, volumes, mounts, ports, containers) sorted."""
    if isinstance(value, dict):
        return {k: unordered(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [unordered(v) for v in value]
        if all(isinstance(v, dict) and ("name" in v or "mountPath" in v) for v in items):
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
        return items
    return value


def test_the_cluster_view_is_what_serve_and_reconcile_do_beside_volcano(capsys, tmp_path, monkeypatch):
    """With the cluster's settings (a config file: jobs from the cluster, so Volcano's controller runs
    spec.plugins; a plugin every job gets) and ``--cluster``, ``review`` gives the Pod as Volcano's
    controller sends it, the webhook built from the same settings patches it, the result is what
    ``mutate`` prints and the patch exactly what ``mutate --patch`` prints, from the review or from
    the task; ``resources`` prints what the reconciler of those settings makes."""
    import asyncio

    import httpx
    import jsonpatch

    from volcano_job_webhook.config import load_settings
    from volcano_job_webhook.server.app import create_app
    from volcano_job_webhook.server.jobs import DirectoryJobSource

    config = tmp_path / "config.yaml"
    config.write_text("job_source: kube\ndefault_plugins: {hostfile: []}\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    job = jobs / "pytorch-job.yaml"
    job.write_text((EXAMPLES / "jobs" / "pytorch-job.yaml").read_text())
    code, out, err = run(capsys, "review", "--job", str(job), "--task", "worker", "--index", "1", "--config", str(config), "--cluster")
    assert code == 0
    assert err == "view: cluster: the Pod as its controller sends it, wired by the plugins Volcano's controller runs: pytorch\n"
    (tmp_path / "review.json").write_text(out)
    review = json.loads(out)
    sent = review["request"]["object"]
    assert "MASTER_ADDR" in [e["name"] for e in sent["spec"]["containers"][0]["env"]], "wired by Volcano's pytorch"
    assert "hostfile" not in json.dumps(sent), "not by ours"

    async def answer() -> dict:
        source = DirectoryJobSource(jobs, interval=0)
        app = create_app(source, load_settings(str(config)).chain())
        async with app.router.lifespan_context(app):
            await loaded(source)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
                return (await c.post("/mutate", json=review)).json()["response"]

    response = asyncio.run(answer())
    patch = json.loads(base64.b64decode(response["patch"]))
    served = jsonpatch.apply_patch(sent, patch)
    code, out, err = run(capsys, "mutate", "--job", str(job), "--task", "worker", "--index", "1", "--config", str(config), "--cluster")
    # The same Pod; only the order of entries differs (in two passes Volcano's plugins run first; in
    # Volcano the order is a Go map's anyway).
    assert code == 0 and unordered(json.loads(out)) == unordered(served)
    assert err.startswith("view: cluster: the Pod as it runs, wired by the webhook (svc, hostfile); "
                          "Volcano's controller wired it with pytorch; --patch shows the webhook's part alone\n")
    for pod in (["--task", "worker", "--index", "1"], [str(tmp_path / "review.json")]):
        code, out, err = run(capsys, "mutate", "--job", str(job), *pod, "--config", str(config), "--cluster", "--patch")
        assert code == 0 and json.loads(out) == patch, pod
        assert err.startswith("view: cluster: the webhook's answer (it runs svc, hostfile) to the Pod as its controller sends it; "
                              "Volcano's controller wired it with pytorch\n")
    code, out, err = run(capsys, "resources", "--job", str(job), "--config", str(config), "--cluster")
    assert code == 0
    # svc comes in as pytorch's dependency without spec.plugins naming it: ours to run.
    assert [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(out)] == [
        ("ConfigMap", "pytorch-demo-svc"), ("Service", "pytorch-demo"), ("NetworkPolicy", "pytorch-demo"),
        ("ConfigMap", "pytorch-demo-hostfile")]
    assert err == "view: cluster: the objects the reconciler makes; Volcano's controller makes those of pytorch\n"
    code, _, err = run(capsys, "mutate", "--job", str(job), "--task", "worker", "--config", str(tmp_path / "typo.yaml"))
    assert code == 2 and "typo.yaml does not exist" in err


def test_the_offline_commands_load_no_web_server():
    """mutate, review and resources take the JSON-patch diff and the AdmissionReview from the server
    package, which re-exports lazily: no FastAPI, Starlette or uvicorn is imported for them."""
    import subprocess
    import sys

    program = (
        "import contextlib, io, sys\n"
        "from volcano_job_webhook.cli import main\n"
        f"job = {str(EXAMPLES / 'jobs' / 'pytorch-job.yaml')!r}\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    for argv in (['mutate', '--job', job, '--task', 'worker', '--patch'], ['review', '--job', job, '--task', 'worker'],\n"
        "                 ['resources', '--job', job]):\n"
        "        assert main(argv) == 0, argv\n"
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
