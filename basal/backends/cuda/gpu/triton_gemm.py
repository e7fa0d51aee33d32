"""The `tri` GEMM engine: y = x · Wᵀ with a fixed-order K loop (docs/gpu-path.md §3.1, rule R1).

One program owns a BM×BN output tile and walks K in ascending steps of BK into one f32 accumulator, rounded once
to the output dtype: an element's value depends only on its row of x and on W — not on M, on the row's offset or
on other rows. No split-K, no atomics; `M` is never specialised on (one compiled variant for every row count),
and loads carry masks instead of alignment hints.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from basal.backends.cuda.gpu.kernel_configs import GemmTiles, gemm_tiles


@triton.jit(do_not_specialize=["M"])
def gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,  # 1 on every shipped path; 2 only for the negative control
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_odd = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * stride_wn + k[:, None], mask=(rn[None, :] < N) & (k[:, None] < K), other=0.0)
        if SPLIT_K == 2:  # odd K steps go to a second accumulator: a different summation order
            if (k0 // BK) % 2 == 1:
                acc_odd = tl.dot(a, b, acc_odd, input_precision=PRECISION)
            else:
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if SPLIT_K == 2:
        acc = acc + acc_odd
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def dot_precision(dtype: torch.dtype) -> str:
    """f32 operands: three TF32 passes (about f32 accuracy, on tensor cores); 16-bit operands are exact anyway."""
    return "tf32x3" if dtype == torch.float32 else "ieee"


def linear(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, tiles: GemmTiles | None = None, split_k: int = 1
) -> torch.Tensor:
    """x [M, K] · w [N, K]ᵀ -> [M, N] in x's dtype. `tiles` defaults to the shape's shipped configuration."""
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"linear: x {tuple(x.shape)} and w {tuple(w.shape)} need matching, contiguous K")
    tiles = tiles or gemm_tiles(n, k)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, tiles.bm), triton.cdiv(n, tiles.bn))
    gemm_kernel[grid](
        x,
        w,
        out,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT_K=split_k,
        PRECISION=dot_precision(x.dtype),
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return out
