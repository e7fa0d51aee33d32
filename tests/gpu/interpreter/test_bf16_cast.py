"""The interpreter's f32 -> bf16 cast (interpreter_patches.py, patch 3) against torch's round to nearest even, bit
for bit, and on NaNs: a NaN stays a quiet NaN with its sign, as the GPU's `cvt.rn.bf16.f32` keeps a NaN. Rounding
the raw bits would turn a NaN with a small payload into an infinity and wrap a negative NaN to zero."""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _to_bf16_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i).to(tl.bfloat16))


def _cast(bits: list[int]) -> np.ndarray:
    """uint16 bits of the kernel's bf16 cast of the f32 values with these bits."""
    x = torch.from_numpy(np.asarray(bits, dtype=np.uint32).view(np.float32))
    out = torch.empty(len(bits), dtype=torch.bfloat16)
    _to_bf16_kernel[(1,)](x, out, len(bits))
    return out.view(torch.int16).numpy().view(np.uint16)


def test_f32_to_bf16_rounds_to_nearest_even():
    finite = [0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000, 0x00000001, 0x80000000, 0x7F7FFFFF]
    finite += [0x7F7F7FFF, 0x7F800000, 0xFF800000]  # ties to even both ways, a denormal, -0, overflow, infinities
    g = torch.Generator().manual_seed(0)
    finite += (torch.randn(64 - len(finite), generator=g) * 1e3).numpy().view(np.uint32).tolist()  # 64 lanes
    want = torch.from_numpy(np.asarray(finite, dtype=np.uint32).view(np.float32)).to(torch.bfloat16)
    assert np.array_equal(_cast(finite), want.view(torch.int16).numpy().view(np.uint16))


def test_f32_to_bf16_keeps_a_nan_a_quiet_nan_with_its_sign():
    nans = [0x7F800001, 0x7F808000, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFF8000, 0xFFFFFFFF]
    assert _cast(nans).tolist() == [0x7FC0] * 4 + [0xFFC0] * 4  # rounding the bits: 7F80 (inf), ..., 0000 (+0)
