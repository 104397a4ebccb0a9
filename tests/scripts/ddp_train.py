"""A plain DDP training script, written the way PyTorch's DDP tutorial writes one: it knows nothing of
fsdp-jobs and runs as `torchrun --nproc-per-node=2 ddp_train.py --epochs 3 --log 1`."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from model_def import ToyNet  # a sibling module: the script's directory travels with it


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--log", type=int, default=1, help="print every N epochs")  # '--log' prefixes torchrun's flags
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"ddp rank {rank} of {world} node {os.environ['GROUP_RANK']} epochs {args.epochs}", flush=True)

    torch.manual_seed(0)
    model = ToyNet().to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 16, generator=gen)
    targets = inputs[:, :4].sum(1, keepdim=True)
    mine = slice(rank * 512 // world, (rank + 1) * 512 // world)
    for epoch in range(args.epochs):
        for i in range(0, 512 // world, 16):
            x = inputs[mine][i:i + 16].to(device)
            y = targets[mine][i:i + 16].to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp_model(x), y)
            loss.backward()
            optimizer.step()
        if rank == 0 and epoch % args.log == 0:
            print(f"ddp epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
