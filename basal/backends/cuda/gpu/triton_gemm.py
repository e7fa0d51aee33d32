"""The `tri` GEMM: y = x · Wᵀ with a fixed-order K loop (docs/gpu-path.md §3.1, rule R1).

One program owns a BM×BN output tile and walks K in ascending steps of BK into one f32 accumulator, rounded once
to the output dtype: an element's value depends only on its row of x and on W — not on M, on the row's offset or
on other rows. No split-K, no atomics; `M` is never specialised on (one compiled variant for every row count),
and loads carry masks instead of alignment hints.

Two fused epilogues (docs/gpu-path.md §3.3), with the rounding points of the separate kernels they replace, so a
fused forward has the bits of an unfused one: `residual` adds the rounded product to a residual row
(`out = round(r + round(acc))`, the norm kernel's add), and `swiglu` runs a second accumulator over the up rows
of a fused [gate; up] weight with the same K loop and writes `round(round(silu(round(gate))) · round(up))`, so the
[M, 2F] gate/up activation is never written.

A bias (basal-1.0 checkpoints) is added to the f32 accumulator before its rounding, `round(acc + b)`, in every
epilogue (for SwiGLU: the gate's and the up's rows of a fused bias), the way a library GEMM's bias epilogue does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from basal.backends.cuda.gpu.kernel_configs import EPILOGUES, GemmTiles, gemm_tiles
from basal.backends.cuda.gpu.row_chunks import OFFSET_LIMIT, in_row_ranges


@triton.jit(do_not_specialize=["M"])
def gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    r_ptr,  # the residual rows (EPILOGUE 1; may be y itself), else unused
    b_ptr,  # the bias [N] ([2N] with EPILOGUE 2: gate's, then up's) if HAS_BIAS, else unused
    M,
    N,  # output columns; with EPILOGUE 2 the up rows of W start at row N
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_rm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,  # 1 on every shipped path; 2 only for the negative control
    PRECISION: tl.constexpr,
    EPILOGUE: tl.constexpr,  # 0 none, 1 + residual, 2 SwiGLU (EPILOGUES)
    HAS_BIAS: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_odd = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        w_mask = (rn[None, :] < N) & (k[:, None] < K)
        b = tl.load(w_ptr + rn[None, :] * stride_wn + k[:, None], mask=w_mask, other=0.0)
        if SPLIT_K == 2:  # odd K steps go to a second accumulator: a different summation order
            if (k0 // BK) % 2 == 1:
                acc_odd = tl.dot(a, b, acc_odd, input_precision=PRECISION)
            else:
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if EPILOGUE == 2:  # the up rows, the same loads and dots as the plain GEMM would do for them
            b_up = tl.load(w_ptr + (rn[None, :] + N) * stride_wn + k[:, None], mask=w_mask, other=0.0)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=PRECISION)
    if SPLIT_K == 2:
        acc = acc + acc_odd
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE == 2:
            acc_up = acc_up + tl.load(b_ptr + N + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_ty = y_ptr.dtype.element_ty
    if EPILOGUE == 1:
        r = tl.load(r_ptr + rm[:, None] * stride_rm + rn[None, :], mask=mask, other=0.0)
        out = (r.to(tl.float32) + acc.to(out_ty).to(tl.float32)).to(out_ty)
    elif EPILOGUE == 2:
        g = acc.to(out_ty).to(tl.float32)
        silu = tl.div_rn(g, 1.0 + tl.exp(-g)).to(out_ty).to(tl.float32)
        out = (silu * acc_up.to(out_ty).to(tl.float32)).to(out_ty)
    else:
        out = acc.to(out_ty)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], out, mask=mask)


DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


def dot_precision(dtype: torch.dtype) -> str:
    """f32 operands: three TF32 passes (about f32 accuracy, on tensor cores); 16-bit operands are exact anyway."""
    return "tf32x3" if dtype == torch.float32 else "ieee"


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
    split_k: int = 1,
    epilogue: str = "none",
    residual: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] · w [N, K]ᵀ (+ bias [N]) -> [M, N] in x's dtype. `tiles` defaults to the shape's shipped
    configuration. `epilogue`: "residual" returns residual + that ([M, N]; `out` may be `residual`, updated in
    place), "swiglu" reads w (and the bias) as [gate; up] ([2F, K]) and returns silu(gate) · up ([M, F]); both
    keep the unfused bits. A call whose rows pass 32-bit offsets runs as several launches (row_chunks.py)."""
    m, k = x.shape
    n = w.shape[0] // 2 if epilogue == "swiglu" else w.shape[0]
    if w.shape[1] != k or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"linear: x {tuple(x.shape)} and w {tuple(w.shape)} need matching, contiguous K")
    if w.shape[0] * w.stride(0) >= OFFSET_LIMIT:  # rows of x are split below; the weight is read whole
        raise ValueError(f"linear: weight {tuple(w.shape)} passes the kernel's 32-bit offsets")
    if out is not None and (out.shape != (m, n) or out.stride(1) != 1):
        raise ValueError(f"linear: out {tuple(out.shape)} is not a contiguous [{m}, {n}]")
    if (epilogue == "residual") != (residual is not None):
        raise ValueError("linear: a residual is given exactly with the residual epilogue")
    if residual is not None and (residual.shape != (m, n) or residual.stride(1) != 1):
        raise ValueError(f"linear: residual {tuple(residual.shape)} is not a contiguous [{m}, {n}]")
    if bias is not None and (bias.shape != (w.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"linear: bias {tuple(bias.shape)} is not a contiguous [{w.shape[0]}]")
    tiles = tiles or gemm_tiles(w.shape[0], k, DTYPE_NAMES[x.dtype])  # the weight's: fused or not, the same tile
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    r = out if residual is None else residual
    for xs, ys, rs in in_row_ranges(max(x.stride(0), out.stride(0), r.stride(0)), x, out, r):
        gemm_kernel[(triton.cdiv(xs.shape[0], tiles.bm), triton.cdiv(n, tiles.bn))](
            xs,
            w,
            ys,
            rs,
            ys if bias is None else bias,
            xs.shape[0],
            n,
            k,
            xs.stride(0),
            w.stride(0),
            ys.stride(0),
            rs.stride(0),
            BM=tiles.bm,
            BN=tiles.bn,
            BK=tiles.bk,
            SPLIT_K=split_k,
            PRECISION=dot_precision(x.dtype),
            EPILOGUE=EPILOGUES[epilogue],
            HAS_BIAS=bias is not None,
            num_warps=tiles.warps,
            num_stages=tiles.stages,
        )
    return out
