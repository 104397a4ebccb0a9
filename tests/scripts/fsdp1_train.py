"""A plain FSDP1 script, written the way PyTorch's FSDP tutorial writes one (FullyShardedDataParallel with
transformer_auto_wrap_policy): it knows nothing of fsdp-jobs. On CPU, torch 2.13's FSDP1 needs
device_id=torch.device("cpu"); on GPUs it keeps the tutorial's own device logic."""

import argparse
import functools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from model_def import Block, BlockNet


def main():
    parser = argparse.ArgumentParser(description="FSDP1 example")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        device_id = torch.cuda.current_device()
        device = torch.device("cuda", device_id)
    else:
        dist.init_process_group("gloo")
        device_id = device = torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(BlockNet(), auto_wrap_policy=auto_wrap_policy, device_id=device_id)
    units = sum(isinstance(m, FSDP) for m in model.modules())
    print(f"fsdp1 rank {rank} of {world} node {os.environ['GROUP_RANK']} units {units}", flush=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    first = last = None
    for epoch in range(args.epochs):
        for i in range(8):
            gen = torch.Generator().manual_seed(epoch * 1000 + i * 10 + rank)
            x = torch.randn(16, 8, generator=gen)
            y = x[:, :4].sum(1, keepdim=True).sin()
            x, y = x.to(device), y.to(device)  # inputs and targets on the model's device
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            first = loss.item() if first is None else first
            last = loss.item()
    dist.all_reduce(torch.zeros(1, device=device))  # every rank is done (NCCL reduces device tensors only)
    if rank == 0:
        print(f"fsdp1 loss {first:.4f} -> {last:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
