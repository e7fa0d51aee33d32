"""RMSNorm (+ residual), RoPE + K/V write, SwiGLU and the letter readout under the interpreter: a row alone gives the
bits it gets inside batches of 1, 7 and 64 rows, and every kernel agrees with the torch CPU path's formulas."""

from __future__ import annotations

import pytest
import torch

from basal.backends.cuda import ops as cpu
from basal.backends.cuda.gpu.triton_rowwise import letter_readout, rmsnorm, rope_kv, swiglu

BATCHES = [1, 7, 64]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _in_batches(fn, anchor: torch.Tensor, filler: torch.Tensor) -> set[bytes]:
    out = set()
    for m in BATCHES:
        pos = m // 2
        rows = torch.cat([filler[:pos], anchor[None], filler[pos : m - 1]])
        out.add(_bits(fn(rows)[pos]))
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rmsnorm_with_residual(dtype):
    g = torch.Generator().manual_seed(0)
    hidden = 96
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    h, y = (torch.randn(70, hidden, generator=g).to(dtype) for _ in range(2))

    def run(rows_h, rows_y):
        hh = rows_h.clone()
        x = torch.empty_like(hh)
        rmsnorm(hh, w, 1e-5, x, rows_y)
        return torch.cat([hh, x], dim=1)

    both = torch.cat([h, y], dim=1)
    assert len(_in_batches(lambda r: run(r[:, :hidden], r[:, hidden:]), both[0], both[1:])) == 1
    out = run(h[:5], y[:5])
    summed = h[:5] + y[:5]
    assert torch.equal(out[:, :hidden], summed)  # the residual add rounds once, as torch does
    ref = cpu.rms_norm(summed, w, 1e-5, 64)
    tol = 0 if dtype == torch.float32 else 1e-2
    assert (out[:, hidden:].float() - ref.float()).abs().max() <= tol + 1e-6


def test_rope_kv_matches_the_cpu_formula():
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, dim = 4, 2, 16
    cos, sin = cpu.rope_tables(64, dim, 10000.0)
    qkv = torch.randn(9, (heads + 2 * kv_heads) * dim, generator=g).half()
    pos = torch.tensor([0, 1, 2, 30, 31, 32, 5, 63, 7], dtype=torch.int32)
    q, k = torch.empty(9, heads, dim), torch.empty(9, kv_heads, dim)
    v = torch.empty(9, kv_heads, dim, dtype=torch.float16)
    rope_kv(qkv, pos, cos, sin, q, k, v)
    qq, kk, vv = qkv.float().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    c, s = cos[pos.long()], sin[pos.long()]
    assert (q - cpu.apply_rope(qq.view(9, heads, dim), c, s)).abs().max() <= 1e-6
    assert (k - cpu.apply_rope(kk.view(9, kv_heads, dim), c, s)).abs().max() <= 1e-6
    assert torch.equal(v, vv.half().view(9, kv_heads, dim))


def test_swiglu_row_invariance():
    g = torch.Generator().manual_seed(2)
    gu = (torch.randn(70, 2 * 88, generator=g) * 4).half()
    assert len(_in_batches(lambda r: swiglu(r, torch.empty(r.shape[0], 88, dtype=r.dtype)), gu[0], gu[1:])) == 1
    ref = cpu.swiglu(gu[:4].float()).half()
    assert (swiglu(gu[:4], torch.empty(4, 88, dtype=torch.float16)).float() - ref.float()).abs().max() <= 2e-2


def test_letter_readout_rows_alone_and_in_batches():
    g = torch.Generator().manual_seed(3)
    hidden, letters = 80, 10
    head = torch.zeros(16, hidden)
    head[:letters] = torch.randn(letters, hidden, generator=g).half().float()
    x = torch.randn(70, hidden, generator=g).half()

    def run(r):
        return letter_readout(r, head, letters, torch.empty(r.shape[0], 16))

    assert len(_in_batches(run, x[0], x[1:])) == 1
    out = run(x[:3])
    assert torch.all(out[:, letters:] == 0)
    assert (out[:, :letters].double() - x[:3].double() @ head[:letters].double().T).abs().max() <= 1e-4
