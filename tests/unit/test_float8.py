"""train.float8 (fsdp_jobs/runtime/float8.py): refused in one line where there is no float8 (a CPU, a GPU before
compute capability 8.9, no torchao), and where it runs, the llama's linears but the output projection compute
in float8 and still learn. On this machine torchao's emulated float8 (FSDP_JOBS_TEST_FLOAT8_EMULATE) stands in
for the GPU's float8 matmuls: it checks the wiring, not float8's speed (deploy/gpu-sidebyside/ measures that)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fsdp_jobs.planning.config import ModelConfig
from fsdp_jobs.runtime import float8
from fsdp_jobs.runtime.shard import build_meta_model, materialize

torchao = pytest.importorskip("torchao")  # the float8 extra; the dev extra (and so CI) installs it
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

SMALL = ModelConfig(_target_="fsdp_jobs.models.llama.Transformer", dim=64, n_layers=2, n_heads=4, ffn_dim=128,
                    vocab_size=128, max_seq_len=64)


def test_a_cpu_rank_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv(float8.EMULATE_ENV, raising=False)
    reason = float8.refusal(torch.device("cpu"))
    assert reason and "\n" not in reason and "compute capability >= 8.9" in reason and "runs on the cpu" in reason
    with pytest.raises(RuntimeError, match="drop train.float8"):
        float8.convert(build_meta_model(SMALL), "tensorwise", torch.device("cpu"))


@pytest.mark.parametrize("capability, refused", [((8, 0), True), ((8, 6), True), ((8, 9), False), ((9, 0), False),
                                                 ((10, 0), False)])
def test_a_gpu_before_ada_is_refused_and_naming_it(monkeypatch, capability, refused):
    monkeypatch.delenv(float8.EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    reason = float8.refusal(torch.device("cuda", 0))
    if refused:
        assert reason and f"A100-SXM4-80GB has {capability[0]}.{capability[1]}" in reason, reason
    else:
        assert reason is None


def test_without_torchao_the_plan_says_which_extra_to_install(monkeypatch, tmp_path):
    import importlib.util

    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.planning.validation import _validate_float8
    from fsdp_jobs.planning.config import JobConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    from types import SimpleNamespace

    cfg = JobConfig(cluster=SimpleNamespace(device="cuda"))
    cfg.train.float8 = True
    with pytest.raises(UserError, match=r"pip install 'fsdp-jobs\[float8\]'"):
        _validate_float8(cfg)


def loss_after_training(recipe: str | None, steps: int = 30) -> list[float]:
    torch.manual_seed(0)
    model = build_meta_model(SMALL).to(torch.bfloat16)
    if recipe:
        assert float8.convert(model, recipe, torch.device("cpu")) == 2 * 7  # wq wk wv wo w1 w2 w3 per block
        assert not isinstance(model.output, Float8Linear) and isinstance(model.layers[0].attention.wq, Float8Linear)
    materialize(model, torch.device("cpu"), seed=0)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, SMALL.vocab_size, (8, 33), generator=torch.Generator().manual_seed(1))
    curve = []
    for _ in range(steps):
        loss = F.cross_entropy(model(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optim.step()
        optim.zero_grad()
        curve.append(loss.item())
    return curve


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_layers_learn_what_bfloat16_layers_learn(monkeypatch, recipe):
    """The same 30 steps on one batch: float8's curve falls as bfloat16's does and ends near it (float8 keeps 3
    or 4 significant bits of each operand: a few percent, not bitwise)."""
    monkeypatch.setenv(float8.EMULATE_ENV, "1")
    reference, f8 = loss_after_training(None), loss_after_training(recipe)
    assert f8[-1] < 0.5 * f8[0] and reference[-1] < 0.5 * reference[0], (f8, reference)
    assert abs(f8[-1] - reference[-1]) < 0.1 * reference[0], (f8[-1], reference[-1])
    assert f8 != reference  # the matmuls did run in float8


def test_the_filter_keeps_the_output_projection_and_odd_sizes_in_high_precision():
    assert not float8.convertible(torch.nn.Linear(64, 128), "output")
    assert not float8.convertible(torch.nn.Linear(64, 128), "lm_head")  # a Hugging Face model's
    assert not float8.convertible(torch.nn.Linear(64, 100), "layers.0.feed_forward.w1")
    assert float8.convertible(torch.nn.Linear(64, 128), "layers.0.feed_forward.w1")
