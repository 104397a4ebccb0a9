"""Models the test scripts import from their own directory."""

import torch.nn as nn
import torch.nn.functional as F


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """A residual MLP block: the transformer-layer-like unit the FSDP scripts wrap."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class BlockNet(nn.Module):
    fsdp_wrap_classes = (Block,)  # fsdp_jobs.job.shard wraps these when fsdp.wrap names no classes

    def __init__(self, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)
