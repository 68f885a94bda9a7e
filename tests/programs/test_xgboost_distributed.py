"""The xgboost plugin's environment, read by a real XGBoost program.

The example job's four Pods run ``examples/xgboost/train.py`` as four local processes, each with its
Pod's injected ``DMLC_*`` environment (only the tracker's cluster DNS name swapped for loopback, and
the tracker port moved to a free one through the plugin's own ``--port``). Task 0 starts the tracker;
all four must form one XGBoost group of the job's size, each with the rank its task id gives, and
end with the same model. Needs the ``xgboost`` extra (``pip install -e '.[xgboost]'``, CPU); skipped
without it.
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

pytest.importorskip("xgboost.collective")

from tests.helpers.envtest import free_port
from tests.helpers.jobs import set_plugin_arg
from tests.helpers.wiring import injected_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "jobs" / "xgboost-job.yaml"
SCRIPT = EXAMPLES / "xgboost" / "train.py"
RESULT = re.compile(r"^worker (\d+)/(\d+) task (\d+): rmse ([\d.]+) -> ([\d.]+), model (\w+)$", re.MULTILINE)


def example_job(port: int, workers: int) -> dict[str, Any]:
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["tasks"][1]["replicas"] = workers
    set_plugin_arg(obj, "xgboost", "port", port)
    return obj


# 3: the example as it is. 11: task ids 0..11, past one digit, where the tracker's string order of
# task ids would differ from their numeric order without the script's zero-padding.
@pytest.mark.parametrize("workers", [3, 11])
def test_example_pods_train_one_model(tmp_path, workers):
    port = free_port()
    job_obj = example_job(port, workers)
    pods = [(t["name"], i) for t in job_obj["spec"]["tasks"] for i in range(t["replicas"])]
    procs = []
    for task, index in pods:
        injected = injected_env(job_obj, task, index, "DMLC_")
        assert injected["DMLC_TRACKER_URI"] == "xgboost-demo-master-0.xgboost-demo"
        assert injected["DMLC_TRACKER_PORT"] == str(port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
        env.update(injected, DMLC_TRACKER_URI="127.0.0.1", OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
        procs.append((task, index, injected, subprocess.Popen(
            [sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    try:
        outputs = [(task, index, injected, proc.communicate(timeout=240)[0], proc.returncode)
                   for task, index, injected, proc in procs]
    finally:
        for *_, proc in procs:
            proc.kill()

    models = set()
    ranks = []
    for task, index, injected, out, code in outputs:
        assert code == 0, f"{task}-{index}:\n{out}"
        (found,) = RESULT.findall(out)
        rank, world, task_id, first_rmse, last_rmse, model = found
        assert int(world) == len(pods) == int(injected["DMLC_NUM_WORKER"]), out
        assert int(rank) == int(task_id) == int(injected["DMLC_TASK_ID"]), out
        assert float(last_rmse) < float(first_rmse) / 2, out
        models.add(model)
        ranks.append(int(rank))
    assert sorted(ranks) == list(range(len(pods)))
    assert len(models) == 1, f"the workers ended with different models: {models}"
    # The Pod that starts the tracker is the one the address names.
    tracker_pod = next(o for o in outputs if o[2]["DMLC_TASK_ID"] == "0")
    assert tracker_pod[:2] == ("master", 0)
