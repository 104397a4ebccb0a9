"""The llama's kernels (fsdp_jobs/models/llama.py) against the formulas they replaced, written out here: torch's
fused RMSNorm and a complex-multiply RoPE must train the same model. In float32 (every CPU run, and the
bitwise references of the fault tests) they are the same bits, forward and backward; in bfloat16 RMSNorm
rounds once instead of twice, so it stays within one bfloat16 rounding of the old result."""

from __future__ import annotations

import pytest
import torch

from fsdp_jobs.models import llama

BF16_ROUNDING = 2.0 ** -7  # the spacing of bfloat16 values relative to their size (8 significant bits)


def rms_norm_written_out(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def rope_written_out(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    table = torch.view_as_real(rotations)
    seq = x.shape[1]
    xr = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = table[:seq, :, 0].view(1, seq, 1, -1), table[:seq, :, 1].view(1, seq, 1, -1)
    out = torch.stack((xr[..., 0] * cos - xr[..., 1] * sin, xr[..., 0] * sin + xr[..., 1] * cos), dim=-1)
    return out.flatten(-2).type_as(x)


def forward_and_grads(fn, *tensors: torch.Tensor) -> list[torch.Tensor]:
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*leaves)
    (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    return [out.detach()] + [t.grad for t in leaves if t.grad is not None]


def inputs(dtype: torch.dtype, dim: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(4, 64, dim, generator=gen)).to(dtype)
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    return x, weight


def test_rms_norm_is_the_same_bits_in_float32_forward_and_backward():
    x, weight = inputs(torch.float32)
    norm = llama.RMSNorm(x.shape[-1], eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(weight)
    new = forward_and_grads(lambda x, w: torch.nn.functional.rms_norm(x, norm.normalized_shape, w, norm.eps), x, weight)
    old = forward_and_grads(lambda x, w: rms_norm_written_out(x, w, 1e-5), x, weight)
    for a, b in zip(new, old):
        assert torch.equal(a, b)
    assert torch.equal(norm(x), old[0])  # the module is that kernel


def test_rms_norm_in_bfloat16_is_within_one_rounding_of_the_written_out_formula():
    x, weight = inputs(torch.bfloat16)
    new = forward_and_grads(lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5), x, weight)
    old = forward_and_grads(lambda x, w: rms_norm_written_out(x, w, 1e-5), x, weight)
    exact = forward_and_grads(lambda x, w: rms_norm_written_out(x.double(), w.double(), 1e-5), x, weight)
    for a, b, ref in zip(new, old, exact):
        scale = ref.double().abs().max()
        assert (a.double() - b.double()).abs().max() <= 2 * BF16_ROUNDING * scale
        # the fused kernel rounds once: never further from the exact result than the old one, by more than a rounding
        assert (a.double() - ref.double()).abs().max() <= (b.double() - ref.double()).abs().max() + BF16_ROUNDING * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_as_one_complex_multiply_is_the_same_bits(dtype):
    rotations = torch.view_as_complex(llama.rope_table(64, 4096, 500000.0)[:3000])
    x = torch.randn(2, 3000, 4, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    new = forward_and_grads(lambda x: llama.apply_rope(x, rotations), x)
    old = forward_and_grads(lambda x: rope_written_out(x, rotations), x)
    for a, b in zip(new, old):
        assert a.dtype == b.dtype == dtype and torch.equal(a, b)
