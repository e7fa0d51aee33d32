"""The launchers refuse tensor layouts their kernels do not index: a kernel computes `row * stride + column` with the
strides it is given and hard-codes the rest (a head's D, a readout row's 16), so a view with other strides would
read or write other addresses on a GPU, silently. Each case here is one such view; the contiguous call beside it
runs."""

from __future__ import annotations

import pytest
import torch

from basal.backends.cuda.gpu import row_chunks, triton_attention, triton_gemm, triton_rowwise
from basal.backends.cuda.gpu.kernel_configs import ATTENTION, READOUT_LETTERS

F16 = torch.float16


def test_linear_refuses_a_strided_out_and_a_weight_past_32_bit_offsets(monkeypatch):
    x, w = torch.randn(4, 32, dtype=F16), torch.randn(16, 32, dtype=F16)
    triton_gemm.linear(x, w, out=torch.empty(4, 16, dtype=F16))
    with pytest.raises(ValueError, match="out"):
        triton_gemm.linear(x, w, out=torch.empty(16, 4, dtype=F16).t())
    monkeypatch.setattr(triton_gemm, "OFFSET_LIMIT", 16 * 32)
    with pytest.raises(ValueError, match="32-bit"):
        triton_gemm.linear(x, w)


def test_rowwise_launchers_refuse_strided_views():
    h, w = torch.randn(4, 32, dtype=F16), torch.ones(32, dtype=F16)
    triton_rowwise.rmsnorm(h, w, 1e-5, torch.empty(4, 32, dtype=F16))
    with pytest.raises(ValueError, match="weight"):
        triton_rowwise.rmsnorm(h, torch.ones(64, dtype=F16)[::2], 1e-5, torch.empty(4, 32, dtype=F16))
    gate_up = torch.randn(4, 64, dtype=F16)
    triton_rowwise.swiglu(gate_up, torch.empty(4, 32, dtype=F16))
    with pytest.raises(ValueError, match="swiglu"):
        triton_rowwise.swiglu(gate_up, torch.empty(32, 4, dtype=F16).t())
    rows, x = torch.randn(READOUT_LETTERS, 32), torch.randn(4, 32, dtype=F16)
    triton_rowwise.letter_readout(x, rows, 3, torch.empty(4, READOUT_LETTERS))
    with pytest.raises(ValueError, match="out"):
        triton_rowwise.letter_readout(x, rows, 3, torch.empty(4, 2 * READOUT_LETTERS)[:, ::2])
    with pytest.raises(ValueError, match="letter rows"):
        triton_rowwise.letter_readout(x, torch.randn(32, READOUT_LETTERS).t(), 3, torch.empty(4, READOUT_LETTERS))


def test_rope_refuses_strided_tables():
    heads, kv_heads, dim, tokens = 2, 1, 8, 3
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=F16)
    q = torch.empty(tokens, heads, dim, dtype=F16)
    k, v = torch.empty(tokens, kv_heads, dim, dtype=F16), torch.empty(tokens, kv_heads, dim, dtype=F16)
    positions = torch.arange(tokens, dtype=torch.int32)
    cos, sin = torch.randn(16, dim), torch.randn(16, dim)
    triton_rowwise.rope_kv(qkv, positions, cos, sin, q, k, v)
    with pytest.raises(ValueError, match="cos and sin"):
        triton_rowwise.rope_kv(qkv, positions, torch.randn(dim, 16).t(), sin, q, k, v)


def test_attention_refuses_q_and_out_without_contiguous_heads():
    t, heads, kv_heads, dim = 4, 4, 2, 16
    q = torch.randn(heads, t, dim).transpose(0, 1)  # [T, H, D] with the head stride T·D
    k = torch.randn(t, kv_heads, dim)
    out = torch.empty(t, heads, dim)
    args = (k, k.clone(), k[:1].clone(), k[:1].clone())
    tiles, count, ranges = torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), None
    with pytest.raises(ValueError, match="q and out"):
        triton_attention.tree_attention(q, *args, out, tiles, count, ranges, ATTENTION["f32"])
    with pytest.raises(ValueError, match="V buffers"):
        triton_attention.tree_attention(
            q.contiguous(), k, k[:2].clone(), *args[2:], out, tiles, count, ranges, ATTENTION["f32"]
        )
    assert row_chunks.OFFSET_LIMIT == 2**31  # the checks above are about layout, not size
