"""train.compile: shard_model compiles each wrap unit in place (Module.compile) before fully_shard. What that
gives with torch 2.13 (the comment in shard_model says so): Dynamo skips the compiled _call_impl frame
itself, so FSDP2's hooks run as plain Python, and each block's forward is one graph, with no graph breaks,
with and without activation checkpointing. The eager backend stands in for inductor (no C++ build here)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import init_device_mesh

from fsdp_jobs.planning.config import FSDPConfig, MixedPrecisionConfig
from fsdp_jobs.runtime.shard import shard_model


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class Net(nn.Module):
    fsdp_wrap_classes = (Block,)

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return h


@pytest.mark.parametrize("ac", [False, True])
def test_each_block_compiles_to_one_graph_without_fsdp_hooks_or_breaks(tmp_path, monkeypatch, ac):
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    real_compile = nn.Module.compile
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: real_compile(self, backend=backend))
    torch._dynamo.reset()
    counters.clear()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        reference = Net()
        model = copy.deepcopy(reference)
        fsdp = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype=None, reduce_dtype=None, output_dtype=None,
                                                               buffer_dtype=None), activation_checkpointing=ac)
        shard_model(model, init_device_mesh("cpu", (1,)), fsdp,
                    reshard_after_forward=True, device=torch.device("cpu"), compile_blocks=True)
        x = torch.randn(3, 4)
        for _ in range(2):
            out = model(x)
            out.sum().backward()
        torch.testing.assert_close(out, reference(x))
        assert not counters["graph_break"]
        # the blocks' forward is one code object, and no guard is on the block itself: one graph serves
        # all four (no recompile per layer)
        assert len(graphs) == 1
        for gm in graphs:
            ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
            assert any("linear" in op for op in ops) and any("relu" in op for op in ops), ops  # the block
            assert not any("all_gather" in op or "fsdp" in op or "reduce" in op for op in ops), ops
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
