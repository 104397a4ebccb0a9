"""materialize() and buffers: to_empty() leaves every tensor uninitialised, so buffers that hold values
keep them, meta buffers are rebuilt by the model's init_buffers, and a model with meta buffers and no
init_buffers is refused (on GPU it would have trained on recycled memory)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fsdp_jobs.runtime.shard import BufferInitError, materialize

CPU = torch.device("cpu")


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.arange(1.0, 5.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def test_meta_buffers_without_init_buffers_are_refused_by_name():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), Scaled())
    with pytest.raises(BufferInitError) as e:
        materialize(model, CPU, seed=0)
    text = str(e.value)
    assert text.startswith("Sequential has buffers built on the meta device")
    for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked", "2.scale"):
        assert name in text
    assert "init_buffers(self, device)" in text


def test_buffers_made_on_a_real_device_keep_their_values():
    model = nn.Sequential(Scaled(), Scaled())
    model[1].scale = model[0].scale  # one buffer held by two modules
    for module in model.modules():  # parameters on meta, buffers real (as model=hf builds them)
        for name, p in list(module._parameters.items()):
            module._parameters[name] = nn.Parameter(p.to("meta"))
    materialize(model, CPU, seed=0)
    assert torch.equal(model[0].scale, torch.arange(1.0, 5.0))
    assert model[1].scale is model[0].scale
    assert not any(p.is_meta for p in model.parameters())
    assert torch.equal(model[0].lin.bias, torch.zeros(4))  # the parameters got the seeded init


def test_init_buffers_rebuilds_meta_buffers_on_the_buffer_device():
    class Rebuilt(Scaled):
        def init_buffers(self, device: torch.device) -> None:
            self.calls.append(device)
            self.scale = torch.full((4,), 7.0, device=device)

    with torch.device("meta"):
        model = Rebuilt()
    model.calls = []
    materialize(model, CPU, seed=0, buffer_device=CPU)
    assert model.calls == [CPU] and torch.equal(model.scale, torch.full((4,), 7.0))
