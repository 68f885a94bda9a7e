"""The tensorflow plugin's ``TF_CONFIG``, read by TensorFlow itself.

First its parser: for a job of chief, ps, worker and evaluator tasks (under the default task names,
and under other names given by the role flags), TensorFlow's own
``tf.distribute.cluster_resolver.TFConfigClusterResolver`` must take from each Pod's ``TF_CONFIG``
the Pod's role as task type, its index as task id, its own address as master, and the job's cluster.

Then the real thing: a job of three workers, each Pod a local process with its Pod's ``TF_CONFIG``,
runs one synchronous training step under ``MultiWorkerMirroredStrategy``: every worker must end with
the weights that the gradients of all three give, and the all-reduce of their task ids. Only the
addresses change: each Pod's domain name for ``127.0.0.1``, and each Pod's port for a free one of its
own, because TensorFlow's server listens on its address's port on every interface, so three Pods of
one ``--port`` cannot share one machine. Needs the ``tensorflow`` extra
(``pip install -e '.[tensorflow]'``, CPU); skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# Found, not imported: the framework runs in the Pods' processes only, not in pytest's.
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("needs the tensorflow extra (pip install -e '.[tensorflow]')", allow_module_level=True)

from tests.helpers.jobs import volcano_job
from tests.helpers.wiring import injected_env, unused_ports

ROLES = ("chief", "ps", "worker", "evaluator")

# Each TF_CONFIG given on stdin, read by TensorFlow's resolver as a Pod's TensorFlow program reads it.
RESOLVE = """
import json, os, sys
import tensorflow as tf
for tf_config in json.load(sys.stdin):
    os.environ["TF_CONFIG"] = tf_config
    r = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    print("RESOLVED " + json.dumps([r.task_type, r.task_id, r.master(), r.cluster_spec().as_dict()]), flush=True)
"""

# One synchronous step: each worker's gradient of its own example, summed across the workers by the
# strategy before it is applied, and an all-reduce of the task ids.
TRAIN = """
import json
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.MultiWorkerMirroredStrategy(
    cluster_resolver=resolver,
    communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=60))
with strategy.scope():
    w = tf.Variable([0.0, 0.0])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
i = resolver.task_id
x, y = tf.constant([[1.0, float(i)]]), tf.constant([float(i + 1)])

@tf.function
def step():
    def replica_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((tf.linalg.matvec(x, w) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(float(i)))
    return strategy.run(replica_step)

ids = step()
print("TRAINED " + json.dumps([resolver.task_type, i, strategy.num_replicas_in_sync, float(ids), w.numpy().tolist()]), flush=True)
"""


def tf_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def tf_config(job_obj: dict[str, Any], task: str, index: int) -> str:
    return injected_env(job_obj, task, index, "TF_CONFIG")["TF_CONFIG"]


def test_the_resolver_reads_every_pods_tf_config():
    replicas = {"chief": 1, "ps": 2, "worker": 3, "evaluator": 1}
    expected, configs = [], []
    # The default task names, then others given by the role flags: TensorFlow sees roles either way.
    for names in ({role: role for role in ROLES}, {"chief": "master", "ps": "param", "worker": "trainer", "evaluator": "eval"}):
        flags = [f"--{role}={name}" for role, name in names.items() if role != name]
        job_obj = volcano_job("tf-roles", tasks=[(names[role], replicas[role]) for role in ROLES], plugins={"tensorflow": flags})
        cluster = {role: [f"tf-roles-{names[role]}-{i}.tf-roles:2222" for i in range(replicas[role])] for role in ROLES}
        for role in ROLES:
            for index in range(replicas[role]):
                configs.append(tf_config(job_obj, names[role], index))
                expected.append([role, index, cluster[role][index], cluster])

    done = subprocess.run([sys.executable, "-c", RESOLVE], input=json.dumps(configs), env=tf_env(),
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stdout + done.stderr
    resolved = [json.loads(line.removeprefix("RESOLVED ")) for line in done.stdout.splitlines() if line.startswith("RESOLVED ")]
    assert resolved == expected, done.stdout


def run_together(commands: list[tuple[list[str], dict[str, str]]], logs: Path, timeout: float) -> list[str]:
    """Each command's output once all have exited 0; the first failure or the timeout kills the rest
    and fails, with every output (the others would wait for the failed one to the end)."""
    procs = []
    try:
        for k, (argv, env) in enumerate(commands):
            with (logs / f"{k}.log").open("wb") as log:
                procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if None not in codes or any(codes):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    outputs = [(logs / f"{k}.log").read_text(errors="replace") for k in range(len(commands))]
    report = "\n".join(f"--- process {k}, exit {p.returncode}:\n{out[-3000:]}" for k, (p, out) in enumerate(zip(procs, outputs, strict=True)))
    assert all(p.returncode == 0 for p in procs), f"not every process exited 0 within {timeout} s:\n{report}"
    return outputs


def test_three_workers_train_one_step_in_sync(tmp_path):
    workers = 3
    job_obj = volcano_job("tf-mwms", tasks=[("worker", workers)], plugins={"tensorflow": []})
    names = [f"tf-mwms-worker-{i}.tf-mwms:2222" for i in range(workers)]
    local = {name: f"127.0.0.1:{port}" for name, port in zip(names, unused_ports(workers), strict=True)}
    commands = []
    for index in range(workers):
        config = json.loads(tf_config(job_obj, "worker", index))
        assert config == {"cluster": {"worker": names}, "task": {"type": "worker", "index": index}}
        config["cluster"] = {"worker": [local[name] for name in names]}
        commands.append(([sys.executable, "-c", TRAIN], tf_env() | {"TF_CONFIG": json.dumps(config), "TMPDIR": str(tmp_path)}))
    outputs = run_together(commands, tmp_path, timeout=90)

    # The gradients of (x_i . w - y_i)^2 at w = 0, -2 y_i x_i with x_i = (1, i) and y_i = i + 1, summed
    # over the workers, times -learning rate: what one worker alone, or an average, would not give.
    expected_w = [0.2 * sum(i + 1 for i in range(workers)), 0.2 * sum((i + 1) * i for i in range(workers))]
    for index, out in enumerate(outputs):
        (line,) = [line for line in out.splitlines() if line.startswith("TRAINED ")]
        task_type, task_id, replicas, ids, w = json.loads(line.removeprefix("TRAINED "))
        assert (task_type, task_id, replicas) == ("worker", index, workers), out
        assert ids == sum(range(workers)), out
        assert w == pytest.approx(expected_w), out
