"""Data-parallel training for the paddle plugin's example job, started on every Pod as a plain
``python -m paddle.distributed.launch train.py``.

The launcher takes ``--master``, ``--nnodes``, ``--rank`` and ``--job_id`` from the plugin's
``PADDLE_MASTER``, ``PADDLE_NNODES``, ``PADDLE_RANK`` and ``PADDLE_JOB_ID``, meets the other Pods at
the master, and starts this script with ``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM`` and the
collective's endpoints, which ``init_parallel_env`` reads. Nothing is configured here. Each rank
trains on its own synthetic data; gradients are all-reduced, so every rank ends with the same weights.
"""

from __future__ import annotations

import paddle
import paddle.distributed as dist
from paddle import nn


def main(steps: int = 20) -> None:
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()

    paddle.seed(0)  # the same starting weights everywhere
    model = paddle.DataParallel(nn.Linear(8, 1))
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    target = paddle.linspace(-1.0, 1.0, 8).reshape([8, 1])
    paddle.seed(1 + rank)  # each rank its own data
    first = last = 0.0
    for step in range(steps):
        x = paddle.randn([32, 8])
        loss = nn.functional.mse_loss(model(x), x @ target)
        loss.backward()  # gradients are averaged across all ranks here
        optimizer.step()
        optimizer.clear_grad()
        last = float(loss)
        first = last if step == 0 else first
    weights = ",".join(f"{w:.6f}" for w in model.parameters()[0].numpy().ravel())
    print(f"rank {rank}/{world}: loss {first:.3f} -> {last:.3f}, weights {weights}", flush=True)


if __name__ == "__main__":
    main()
