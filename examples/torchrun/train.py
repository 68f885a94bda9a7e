"""A minimal DistributedDataParallel script for the torchrun plugin's example job.

Run as plain ``torchrun train.py``: torchrun takes --nnodes, --node-rank, --nproc-per-node,
--master-addr and --master-port from the PET_* variables the plugin injects, starts the processes
and gives each one RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
``init_process_group`` reads (the env:// default). Nothing is configured here.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main(steps: int = 20, pause: float = float(os.environ.get("STEP_SECONDS", "0"))) -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")  # env:// from torchrun's variables
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same model everywhere; DDP also broadcasts rank 0's weights
    model = DistributedDataParallel(nn.Linear(16, 1).to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)  # each rank its own data
    for step in range(steps):
        x = torch.randn(32, 16, generator=generator).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # gradients are averaged across all ranks here
        optimizer.step()
        time.sleep(pause)  # STEP_SECONDS: slow enough to watch (or to lose a Pod) while it trains
        if rank == 0 and step % 5 == 0:
            print(f"step {step}: loss {loss.item():.4f} (world size {world})", flush=True)
    dist.barrier()
    if rank == 0:
        print("done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
