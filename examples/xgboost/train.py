"""Distributed XGBoost for the xgboost plugin's example job: one model trained by every Pod together.

Everything comes from the plugin's environment: ``DMLC_TRACKER_URI`` and ``DMLC_TRACKER_PORT`` (where
the tracker listens), ``DMLC_NUM_WORKER`` (the group's size) and ``DMLC_TASK_ID`` (this Pod's id).
XGBoost 3 reads none of them by itself, so this script:

* starts the tracker (``xgboost.tracker.RabitTracker``) on task 0 — the plugin gives task id 0 to the
  tracker task's Pod 0, the Pod ``DMLC_TRACKER_URI`` names — and waits for it at the end;
* joins the group with ``collective.CommunicatorContext`` on every Pod, task 0 included;
* trains on its own shard of synthetic data; the histograms are all-reduced, so every worker ends
  with the same model.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import xgboost as xgb
from xgboost import collective
from xgboost.tracker import RabitTracker

# Workers may start long before the tracker's Pod (image pulls); XGBoost waits 2 s more per attempt.
CONNECT_RETRIES = 20


def shard(rank: int, rows: int = 500, features: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """This worker's part of one synthetic regression problem: y = x . w + noise."""
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(rows, features))
    y = x @ np.linspace(-1.0, 1.0, features) + rng.normal(scale=0.1, size=rows)
    return x, y


def main(rounds: int = 20) -> None:
    uri = os.environ["DMLC_TRACKER_URI"]
    port = int(os.environ["DMLC_TRACKER_PORT"])
    workers = int(os.environ["DMLC_NUM_WORKER"])
    task = int(os.environ["DMLC_TASK_ID"])

    tracker = None
    if task == 0:
        # sortby="task": ranks follow the task ids below instead of the workers' IP addresses.
        tracker = RabitTracker(n_workers=workers, host_ip="0.0.0.0", port=port, sortby="task")
        tracker.start()

    # The tracker compares task ids as strings; zero-padding them makes rank == DMLC_TASK_ID.
    task_id = f"{task:0{len(str(workers - 1))}d}"
    with collective.CommunicatorContext(
        dmlc_tracker_uri=uri, dmlc_tracker_port=port, dmlc_task_id=task_id, dmlc_retry=CONNECT_RETRIES
    ):
        rank, world = collective.get_rank(), collective.get_world_size()
        x, y = shard(rank)
        train = xgb.DMatrix(x, label=y)
        params = {"objective": "reg:squarederror", "tree_method": "hist", "max_depth": 4, "eta": 0.3, "nthread": 1}
        history: dict[str, dict[str, list[float]]] = {}
        booster = xgb.train(params, train, num_boost_round=rounds, evals=[(train, "train")], evals_result=history, verbose_eval=False)
        rmse = history["train"]["rmse"]
        digest = hashlib.sha256(bytes(booster.save_raw("json"))).hexdigest()[:16]
        print(f"worker {rank}/{world} task {task}: rmse {rmse[0]:.3f} -> {rmse[-1]:.3f}, model {digest}", flush=True)

    if tracker is not None:
        tracker.wait_for()


if __name__ == "__main__":
    main()
