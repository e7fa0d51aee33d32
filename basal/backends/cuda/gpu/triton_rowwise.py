"""Row-wise Triton kernels: RMSNorm with the residual add, RoPE with the K/V write, SwiGLU, the letter readout
(docs/gpu-path.md §3.3-§3.4, rules R2 and R4).

Every reduction is one program per row with a block size and warp count fixed per model shape, never derived from
the forward, so a row's bits do not depend on how many rows run with it. The rounding points follow the torch CPU
path (`basal.backends.cuda.ops`): normalise in f32, round to the compute dtype, multiply by the weight; silu in
f32, round, multiply by up; the residual add rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from basal.backends.cuda.gpu.kernel_configs import (
    READOUT_CHUNK,
    READOUT_LETTERS,
    elementwise_block,
    norm_config,
)
from basal.backends.cuda.gpu.row_chunks import in_row_ranges


@triton.jit(do_not_specialize=["eps"])
def rmsnorm_kernel(
    h_ptr, y_ptr, w_ptr, x_ptr, H, eps, stride_h, stride_y, stride_x, HAS_Y: tl.constexpr, BLOCK: tl.constexpr
):
    """h += y (rounded, in place) if HAS_Y; x = (h / rms(h)) rounded · w."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    h = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0)
    if HAS_Y:
        y = tl.load(y_ptr + row * stride_y + cols, mask=ok, other=0.0)
        h = (h.to(tl.float32) + y.to(tl.float32)).to(h.dtype)
        tl.store(h_ptr + row * stride_h + cols, h, mask=ok)
    h32 = h.to(tl.float32)
    mean_square = tl.div_rn(tl.sum(h32 * h32, axis=0), H * 1.0)
    normed = tl.div_rn(h32, tl.sqrt_rn(mean_square + eps)).to(h.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    # a product of two 16-bit values is exact in f32: rounding it once is the 16-bit multiply
    tl.store(x_ptr + row * stride_x + cols, (normed * w).to(h.dtype), mask=ok)


def rmsnorm(
    h: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """out = RMSNorm(h + residual)·w; with `residual`, h is updated in place first. All [M, H] rows."""
    hidden = h.shape[1]
    y = h if residual is None else residual
    if h.stride(1) != 1 or y.stride(1) != 1 or out.stride(1) != 1 or w.shape != (hidden,) or w.stride(0) != 1:
        raise ValueError("rmsnorm: rows and the weight must be contiguous")
    cfg = norm_config(hidden)
    for hs, ys, xs in in_row_ranges(max(h.stride(0), y.stride(0), out.stride(0)), h, y, out):
        rmsnorm_kernel[(hs.shape[0],)](
            hs,
            ys,
            w,
            xs,
            hidden,
            eps,
            hs.stride(0),
            ys.stride(0),
            xs.stride(0),
            HAS_Y=residual is not None,
            BLOCK=cfg.block,
            num_warps=cfg.warps,
        )
    return out


@triton.jit
def rope_kv_kernel(
    qkv_ptr,  # [T, (H + 2 KVH) D] compute dtype
    pos_ptr,  # [T] int32
    cos_ptr,  # [P, D] f32
    sin_ptr,
    q_ptr,  # [T, H, D]
    k_ptr,  # [T, KVH, D]
    v_ptr,  # [T, KVH, D]
    stride_qkv,
    H: tl.constexpr,
    KVH: tl.constexpr,
    D: tl.constexpr,
    SLOTS: tl.constexpr,  # next power of two >= H + 2 KVH
):
    """One program per token: q and k heads are rotated (rotate-half, in f32), v heads copied."""
    t = tl.program_id(0)
    slot = tl.arange(0, SLOTS)[:, None]  # [SLOTS, 1] head slot: q heads, k heads, v heads
    half = tl.arange(0, D // 2)[None, :]
    ok = slot < H + 2 * KVH
    src = qkv_ptr + t * stride_qkv + slot * D + half
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + D // 2, mask=ok, other=0.0).to(tl.float32)
    p = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + p * D + half)
    s = tl.load(sin_ptr + p * D + half)
    rotate = slot < H + KVH
    o1 = tl.where(rotate, x1 * c - x2 * s, x1)
    o2 = tl.where(rotate, x2 * c + x1 * s, x2)
    is_q = slot < H
    is_k = rotate & (slot >= H)
    is_v = ok & (slot >= H + KVH)
    q_dst = q_ptr + (t * H + slot) * D + half
    k_dst = k_ptr + (t * KVH + slot - H) * D + half
    v_dst = v_ptr + (t * KVH + slot - H - KVH) * D + half
    tl.store(q_dst, o1.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(q_dst + D // 2, o2.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(k_dst, o1.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_dst + D // 2, o2.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(v_dst, o1.to(v_ptr.dtype.element_ty), mask=is_v)
    tl.store(v_dst + D // 2, o2.to(v_ptr.dtype.element_ty), mask=is_v)


def rope_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Split the fused qkv output [T, (H + 2 KVH) D] into rotated Q [T, H, D], rotated K and plain V [T, KVH, D]."""
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()) or qkv.stride(1) != 1:
        raise ValueError("rope_kv: contiguous Q/K/V buffers needed")
    if not (cos.is_contiguous() and sin.is_contiguous()) or cos.shape != sin.shape or cos.shape[1] != dim:
        raise ValueError(f"rope_kv: cos and sin must be contiguous [positions, {dim}] tables")
    slots = 1 << (heads + 2 * kv_heads - 1).bit_length()
    for qkv_s, pos_s, q_s, k_s, v_s in in_row_ranges(max(qkv.stride(0), q.stride(0)), qkv, positions, q, k, v):
        rope_kv_kernel[(qkv_s.shape[0],)](
            qkv_s,
            pos_s,
            cos,
            sin,
            q_s,
            k_s,
            v_s,
            qkv_s.stride(0),
            H=heads,
            KVH=kv_heads,
            D=dim,
            SLOTS=slots,
            num_warps=4,
        )


@triton.jit
def swiglu_kernel(gu_ptr, a_ptr, F, stride_gu, stride_a, BLOCK: tl.constexpr):
    """a = silu(gate) rounded · up, gate and up the two halves of the fused gate_up row."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    gate = tl.load(gu_ptr + row * stride_gu + cols, mask=ok, other=0.0)
    up = tl.load(gu_ptr + row * stride_gu + F + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    silu = tl.div_rn(g, 1.0 + tl.exp(-g)).to(gate.dtype).to(tl.float32)
    tl.store(a_ptr + row * stride_a + cols, (silu * up.to(tl.float32)).to(gate.dtype), mask=ok)


def swiglu(gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    f = gate_up.shape[1] // 2
    if gate_up.stride(1) != 1 or out.stride(1) != 1 or out.shape != (gate_up.shape[0], f):
        raise ValueError(f"swiglu: gate_up {tuple(gate_up.shape)} and out {tuple(out.shape)} need contiguous rows")
    block = elementwise_block(f)
    for gu, a in in_row_ranges(max(gate_up.stride(0), out.stride(0)), gate_up, out):
        swiglu_kernel[(gu.shape[0], triton.cdiv(f, block))](gu, a, f, gu.stride(0), a.stride(0), BLOCK=block)
    return out


@triton.jit
def letter_readout_kernel(x_ptr, w_ptr, out_ptr, H, L, stride_x, BL: tl.constexpr, CHUNK: tl.constexpr):
    """logits[r, u] = Σ_h x[r, h] · W[u, h] in f32, H in fixed chunks; letters past L are 0."""
    row = tl.program_id(0)
    letters = tl.arange(0, BL)
    acc = tl.zeros((BL,), dtype=tl.float32)
    for h0 in range(0, H, CHUNK):
        cols = h0 + tl.arange(0, CHUNK)
        ok = cols < H
        x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + letters[:, None] * H + cols[None, :], mask=(letters[:, None] < L) & ok[None, :], other=0.0)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(out_ptr + row * BL + letters, acc)


def letter_readout(x: torch.Tensor, letter_rows: torch.Tensor, n_letters: int, out: torch.Tensor) -> torch.Tensor:
    """x [R, H] (final-normed) · letter_rows [16, H] f32 -> out [R, 16] f32."""
    hidden = x.shape[1]
    if letter_rows.shape != (READOUT_LETTERS, hidden) or not letter_rows.is_contiguous():
        raise ValueError(f"letter_readout: letter rows must be a contiguous [{READOUT_LETTERS}, {hidden}]")
    if out.shape != (x.shape[0], READOUT_LETTERS) or not out.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"letter_readout: x needs contiguous rows and out must be a contiguous [R, {READOUT_LETTERS}]")
    for xs, outs in in_row_ranges(max(x.stride(0), READOUT_LETTERS), x, out):
        letter_readout_kernel[(xs.shape[0],)](
            xs,
            letter_rows,
            outs,
            hidden,
            n_letters,
            x.stride(0),
            BL=READOUT_LETTERS,
            CHUNK=min(READOUT_CHUNK, 1 << (hidden - 1).bit_length()),
        )
    return out
