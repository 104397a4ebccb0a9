"""The kernels the trainer picks on a GPU (fsdp_jobs/models/llama.py causal_attention, fsdp_jobs/runtime/shard.py
adamw_implementation), checked on CPU against the path the CPU runs keep: the GPU's grouped-query attention
computes what repeating k and v computes, and a CPU run's arithmetic is untouched by the GPU's choices."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from fsdp_jobs.models.llama import causal_attention  # noqa: E402
from fsdp_jobs.runtime.shard import adamw_implementation  # noqa: E402


def qkv(heads: int = 8, kv_heads: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 16, h, 32, generator=gen) for h in (heads, kv_heads, kv_heads))  # type: ignore


def test_native_grouped_query_attention_computes_what_repeated_kv_heads_compute():
    q, k, v = qkv()
    assert torch.allclose(causal_attention(q, k, v, native_gqa=True), causal_attention(q, k, v, native_gqa=False),
                          atol=1e-5, rtol=1e-5)


def test_the_cpu_path_is_the_repeated_kv_heads_bit_for_bit():
    """What the model computed before the GPU path existed: the CPU runs' references stay bitwise equal."""
    q, k, v = qkv()
    rk, rv = k.repeat_interleave(4, dim=2), v.repeat_interleave(4, dim=2)
    before = F.scaled_dot_product_attention(q.transpose(1, 2), rk.transpose(1, 2), rv.transpose(1, 2), is_causal=True)
    assert torch.equal(causal_attention(q, k, v, native_gqa=False), before)


def test_full_multi_head_attention_is_one_path():
    q, k, v = qkv(kv_heads=8)
    assert torch.equal(causal_attention(q, k, v, native_gqa=True), causal_attention(q, k, v, native_gqa=False))


def test_adamw_is_fused_on_a_gpu_and_foreach_on_cpu():
    assert adamw_implementation(torch.device("cuda", 0)) == {"fused": True}
    assert adamw_implementation(torch.device("cpu")) == {"foreach": True}
    torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], **adamw_implementation(torch.device("cpu"))).step()
