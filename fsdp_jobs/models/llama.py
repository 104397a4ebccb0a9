"""A llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) that builds on the meta
device. The same class serves the CPU-sized `tiny` config and the real Llama 3 shapes."""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class RMSNorm(nn.RMSNorm):
    """torch's own RMSNorm (F.rms_norm: one fused kernel on a GPU, as torchtitan's llama uses). It normalises
    in float32 and casts once, after the weight: in float32 the same bits as the formula written out
    (x * rsqrt(mean(x^2) + eps) * weight), in bfloat16 within one rounding of it (tests/unit/test_kernels.py)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__(dim, eps=eps)


def rope_table(head_dim: int, max_seq_len: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """cos/sin of the rotary angles, shape (max_seq_len, head_dim // 2, 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); rotations: the table's rows for these positions as complex64 (see
    Transformer.forward). One complex multiply in float32, as torchtitan's llama does (its apply_rotary_emb:
    x.float() viewed as complex, times freqs_cis, cast back): bfloat16 angles at positions in the thousands
    are off by whole radians (tests/unit/test_rope_precision.py). The same bits as rotating the pairs
    written out (tests/unit/test_kernels.py)."""
    seq = x.shape[1]
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotations[:seq].view(1, seq, 1, -1)).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = apply_rope(self.wq(x).view(b, s, self.n_heads, self.head_dim), rotations)
        k = apply_rope(self.wk(x).view(b, s, self.n_kv_heads, self.head_dim), rotations)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        out = causal_attention(q, k, v, native_gqa=q.is_cuda)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


# the order torchtitan asks for (its ScaledDotProductAttention): cuDNN's kernel, then flash; the memory-efficient one
# before the math kernel, which holds the whole score matrix. A kernel that cannot take the inputs is passed over.
GPU_ATTENTION_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                          SDPBackend.MATH]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, native_gqa: bool) -> torch.Tensor:
    """q: (batch, seq, heads, head_dim); k, v: (batch, seq, kv_heads, head_dim); returns (batch, heads, seq,
    head_dim). On a GPU the attention kernel reads each kv head for its group of query heads itself
    (enable_gqa): no copies of k and v (fsdp_jobs/bench/README.md: the GPU side by side). Elsewhere k and v are
    repeated per query head exactly as before, so the CPU runs and their bitwise references are unchanged."""
    grouped = k.shape[2] != q.shape[2]
    if grouped and not native_gqa:
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    attend = functools.partial(F.scaled_dot_product_attention, q.transpose(1, 2), k.transpose(1, 2),
                               v.transpose(1, 2), is_causal=True, enable_gqa=grouped and native_gqa)
    if not q.is_cuda:
        return attend()
    with sdpa_kernel(GPU_ATTENTION_BACKENDS, set_priority=True):
        return attend()


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, norm_eps: float) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(dim, norm_eps)
        self.feed_forward = FeedForward(dim, ffn_dim)

    def forward(self, x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rotations)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    # the default FSDP wrap units (fsdp.wrap.transformer_blocks overrides)
    fsdp_wrap_classes = (TransformerBlock,)
    # never cast by fsdp.mixed_precision.buffer_dtype: rotary angles need float32 at long positions
    fp32_buffers = ("rope",)

    def __init__(self, dim: int, n_layers: int, n_heads: int, ffn_dim: int, vocab_size: int,
                 n_kv_heads: Optional[int] = None, max_seq_len: int = 2048, norm_eps: float = 1e-5,
                 rope_theta: float = 10000.0, tie_embeddings: bool = False) -> None:
        super().__init__()
        self.dim, self.n_layers, self.n_heads = dim, n_layers, n_heads
        self.max_seq_len, self.rope_theta = max_seq_len, rope_theta
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_heads, n_kv_heads or n_heads, ffn_dim, norm_eps) for _ in range(n_layers))
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # not persistent: recomputed after the meta -> device move, never checkpointed
        self.register_buffer("rope", rope_table(dim // n_heads, max_seq_len, rope_theta), persistent=False)

    def init_buffers(self, device: torch.device) -> None:
        self.rope = rope_table(self.dim // self.n_heads, self.max_seq_len, self.rope_theta, device)

    def init_parameter(self, name: str, full: torch.Tensor, generator: torch.Generator) -> None:
        """Fill the full (unsharded) value of one parameter; std scaled by depth like GPT-2/llama."""
        if name.endswith("norm.weight"):
            full.fill_(1.0)
        elif name.endswith(("wo.weight", "w2.weight")):
            full.normal_(0.0, 0.02 / math.sqrt(2 * self.n_layers), generator=generator)
        else:
            full.normal_(0.0, 0.02, generator=generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        # The blocks get the table as complex64: FSDP2 casts every floating-point tensor argument of a unit
        # to its param_dtype (MixedPrecisionPolicy.cast_forward_inputs), which would hand each block a
        # bfloat16 copy; complex tensors are left alone. Only this sequence's rows: each block saves
        # what it gets for backward.
        rotations = torch.view_as_complex(self.rope[: tokens.shape[1]])
        for layer in self.layers:
            h = layer(h, rotations)
        return self.output(self.norm(h))
