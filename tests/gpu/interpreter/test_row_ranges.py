"""Calls whose rows would pass 32-bit element offsets run as several launches over row ranges (row_chunks.py). With
the limit lowered to a few rows, every launcher splits: each launch stays inside the limit, and the result has
the bits of the one launch the real limit gives (the kernels are row-invariant)."""

from __future__ import annotations

import pytest
import torch

from basal.backends.cuda.gpu import row_chunks, triton_attention, triton_gemm, triton_rowwise
from basal.backends.cuda.gpu.kernel_configs import ATTENTION
from bench.checks.attention_cases import layout, plan_tensors, random_chain

ROWS = 70  # not a multiple of the ranges: the last one is short


class Spy:
    """A kernel that records, per launch, rows × row stride of the tensors it indexes by row."""

    def __init__(self, kernel, row_args: tuple[int, ...]):
        self.kernel, self.row_args, self.spans = kernel, row_args, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.spans.append(max(args[i].shape[0] * args[i].stride(0) for i in self.row_args))
            return self.kernel[grid](*args, **kwargs)

        return launch


def split_and_whole(monkeypatch, module, name: str, row_args: tuple[int, ...], run, width: int):
    """run() with the limit lowered to ~16 rows of `width` elements, then with the real one -> (split, whole)."""
    spy = Spy(getattr(module, name), row_args)
    monkeypatch.setattr(module, name, spy)
    with monkeypatch.context() as m:
        m.setattr(row_chunks, "ROW_ALIGN", 16)
        m.setattr(row_chunks, "OFFSET_LIMIT", 17 * width)  # 16 rows per range
        split = run()
        limit = row_chunks.OFFSET_LIMIT
    assert len(spy.spans) == -(-ROWS // 16) and all(span < limit for span in spy.spans)
    whole = run()
    assert len(spy.spans) == -(-ROWS // 16) + 1
    return split, whole


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("epilogue", ["none", "residual", "swiglu"])
def test_gemm_over_row_ranges(monkeypatch, epilogue):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, 64, generator=g).half()
    w = (torch.randn(64, 64, generator=g) * 0.1).half()
    h = torch.randn(ROWS, 32 if epilogue == "swiglu" else 64, generator=g).half()

    def run():
        if epilogue == "residual":
            out = h.clone()
            return triton_gemm.linear(x, w, out=out, epilogue="residual", residual=out)
        return triton_gemm.linear(x, w, epilogue=epilogue)

    split, whole = split_and_whole(monkeypatch, triton_gemm, "gemm_kernel", (0, 2, 3), run, 64)
    assert _bits(split) == _bits(whole)


def test_row_kernels_over_row_ranges(monkeypatch):
    from basal.backends.cuda import ops as cpu

    g = torch.Generator().manual_seed(1)
    hidden = 64
    h, y = (torch.randn(ROWS, hidden, generator=g).half() for _ in range(2))
    w = (torch.rand(hidden, generator=g) + 0.5).half()

    def norm():
        hh, x = h.clone(), torch.empty_like(h)
        triton_rowwise.rmsnorm(hh, w, 1e-5, x, y)
        return torch.cat([hh, x], 1)

    split, whole = split_and_whole(monkeypatch, triton_rowwise, "rmsnorm_kernel", (0, 1, 3), norm, hidden)
    assert _bits(split) == _bits(whole)

    gate_up = torch.randn(ROWS, 2 * hidden, generator=g).half()
    split, whole = split_and_whole(
        monkeypatch, triton_rowwise, "swiglu_kernel", (0, 1),
        lambda: triton_rowwise.swiglu(gate_up, torch.empty(ROWS, hidden, dtype=torch.float16)), 2 * hidden,
    )  # fmt: skip
    assert _bits(split) == _bits(whole)

    heads, kv_heads, dim = 2, 1, 16
    cos, sin = cpu.rope_tables(128, dim, 10000.0)
    qkv = torch.randn(ROWS, (heads + 2 * kv_heads) * dim, generator=g).half()
    pos = torch.randperm(ROWS, generator=g).to(torch.int32)

    def rope():
        q, k = torch.empty(ROWS, heads, dim), torch.empty(ROWS, kv_heads, dim)
        v = torch.empty(ROWS, kv_heads, dim, dtype=torch.float16)
        triton_rowwise.rope_kv(qkv, pos, cos, sin, q, k, v)
        return torch.cat([q.flatten(1), k.flatten(1), v.float().flatten(1)], 1)

    split, whole = split_and_whole(monkeypatch, triton_rowwise, "rope_kv_kernel", (0, 4), rope, qkv.shape[1])
    assert _bits(split) == _bits(whole)

    letters = torch.randn(16, hidden, generator=g)
    split, whole = split_and_whole(
        monkeypatch, triton_rowwise, "letter_readout_kernel", (0, 2),
        lambda: triton_rowwise.letter_readout(h, letters, 5, torch.empty(ROWS, 16)), hidden,
    )  # fmt: skip
    assert _bits(split) == _bits(whole)


def test_attention_refuses_a_batch_past_its_offsets(monkeypatch):
    """Attention cannot split rows (a query reads keys anywhere in the batch), so past the limit it says so instead of
    reading wrapped addresses."""
    cfg = ATTENTION["f16"]
    chain = random_chain(9, 0, 6, 1, 16, seed=0, dtype=torch.float16)
    batch, q, k, v, _ = layout(chain, [], [], seed=0)
    tiles, count, ranges = plan_tensors(batch, 0, cfg.tokens_per_tile(6))
    empty = torch.zeros(1, 1, 16, dtype=torch.float16)
    out = torch.zeros(q.shape[0], 6, 16, dtype=torch.float16)
    args = (q.half(), k.half(), v.half(), empty, empty, out, tiles, count, ranges, cfg)
    triton_attention.tree_attention(*args)
    monkeypatch.setattr(triton_attention, "OFFSET_LIMIT", q.shape[0] * 6 * 16)
    with pytest.raises(ValueError, match="32-bit offsets"):
        triton_attention.tree_attention(*args)
