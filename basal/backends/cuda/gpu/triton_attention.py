"""Tree attention with key tiles anchored at position 0 (docs/gpu-path.md §3.2, rule R3).

Grid `(tile capacity, KV heads)`: a program takes one query tile of `basal.core.packing.tile_layout` — up to NT tokens
of one block, × the G query heads that share this KV head = BM rows — and walks its keys in logical tiles
`[j·BN, (j+1)·BN)` for j = 0 … last position // BN. Each key position is mapped to its physical row through the
block's chain ranges (a static loop over `RANGES` range starts), so a query reads its cached prefix, its ancestors
and its own block in position order, wherever the packer put them. A row's arithmetic is then a function of its
query and its keys in logical order only: alone, in a tree, read out alone or regrouped, the bits are the same.

A tile past a row's last key is an exact no-op for that row: every update is guarded with `where(active, new,
old)` (multiplying by 1.0 would turn −0.0 into +0.0). Programs past the forward's tile count do nothing, so the grid
is a bucket constant and safe to capture in a CUDA graph.

`ANCHOR_AT_QUERY` anchors the key tiles at the query tile's first position instead: the negative control of the
tests, never used by the model.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from basal.backends.cuda.gpu.kernel_configs import AttentionConfig
from basal.backends.cuda.gpu.row_chunks import OFFSET_LIMIT
from basal.core.packing.tile_layout import RANGES


@triton.jit
def tree_attention_kernel(
    q_ptr,  # [T, H, D] f32 (precision f32) or compute dtype
    k_ptr,  # [T, KVH, D] the forward's keys (as q)
    v_ptr,  # [T, KVH, D] the forward's values, compute dtype
    pk_ptr,  # [P, KVH, D] cached-prefix keys of this layer
    pv_ptr,  # [P, KVH, D] cached-prefix values
    out_ptr,  # [T, H, D] compute dtype
    tiles_ptr,  # [cap, 4] int32 (q0, nq, pos0, block)
    count_ptr,  # int32: tiles in use
    ranges_ptr,  # [B, RANGES, 3] int32 (logical_start, base, phys_start)
    stride_qt,
    stride_kt,
    stride_ot,
    scale_log2e,
    G: tl.constexpr,
    NT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    D: tl.constexpr,
    KVH: tl.constexpr,
    N_RANGES: tl.constexpr,
    PRECISION: tl.constexpr,  # "tf32x3" (f32 mode) or "ieee" (16-bit operands)
    F32: tl.constexpr,
    ANCHOR_AT_QUERY: tl.constexpr,
):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    live = t < tl.load(count_ptr)
    q0 = tl.load(tiles_ptr + t * 4 + 0, mask=live, other=0)
    nq = tl.load(tiles_ptr + t * 4 + 1, mask=live, other=0)
    pos0 = tl.load(tiles_ptr + t * 4 + 2, mask=live, other=0)
    block = tl.load(tiles_ptr + t * 4 + 3, mask=live, other=0)

    rows = tl.arange(0, BM)
    tok = rows // G  # [BM] token of the tile
    head = kvh * G + rows % G  # [BM] query head
    row_ok = (tok < nq) & (tok < NT)
    pos = pos0 + tok
    d = tl.arange(0, D)
    q = tl.load(
        q_ptr + (q0 + tok)[:, None] * stride_qt + head[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0
    )

    last = pos0 + nq - 1  # the tile's last query position
    shift = 0
    if ANCHOR_AT_QUERY:
        shift = (BN - pos0 % BN) % BN
    m = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    for j in range(0, (last + shift + BN) // BN):
        kp = j * BN + tl.arange(0, BN) - shift  # [BN] logical key positions
        key_ok = (kp >= 0) & (kp <= last)
        phys = tl.zeros((BN,), dtype=tl.int32)
        base = tl.zeros((BN,), dtype=tl.int32)
        for r in tl.static_range(N_RANGES):  # the range with the largest start <= kp (starts ascend)
            start = tl.load(ranges_ptr + (block * N_RANGES + r) * 3 + 0)
            take = start <= kp
            phys = tl.where(take, tl.load(ranges_ptr + (block * N_RANGES + r) * 3 + 2) + kp - start, phys)
            base = tl.where(take, tl.load(ranges_ptr + (block * N_RANGES + r) * 3 + 1), base)
        in_prefix = key_ok & (base == 0)  # PREFIX_BUFFER
        in_batch = key_ok & (base == 1)  # BATCH_BUFFER
        offs = phys[:, None] * stride_kt + kvh * D + d[None, :]  # [BN, D]
        k = tl.where(
            in_prefix[:, None],
            tl.load(pk_ptr + offs, mask=in_prefix[:, None], other=0.0),
            tl.load(k_ptr + offs, mask=in_batch[:, None], other=0.0),
        )
        v = tl.where(
            in_prefix[:, None],
            tl.load(pv_ptr + offs, mask=in_prefix[:, None], other=0.0),
            tl.load(v_ptr + offs, mask=in_batch[:, None], other=0.0),
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2e  # [BM, BN]
        visible = key_ok[None, :] & (kp[None, :] <= pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_tile = tl.max(s, axis=1)
        active = m_tile > float("-inf")  # rows with a visible key here; the others keep their bits
        m_new = tl.where(active, tl.maximum(m, m_tile), m)
        p = tl.exp2(s - tl.where(active, m_new, 0.0)[:, None])
        alpha = tl.exp2(tl.where(active, m - m_new, 0.0))
        l_sum = tl.where(active, l_sum * alpha + tl.sum(p, axis=1), l_sum)
        if F32:
            pv = tl.dot(p, v.to(tl.float32), input_precision=PRECISION)
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = tl.where(active[:, None], acc * alpha[:, None] + pv, acc)
        m = m_new
    out = tl.div_rn(acc, tl.where(l_sum > 0, l_sum, 1.0)[:, None])  # `/` is div.full.f32 on the GPU: ~2 ulp
    tl.store(
        out_ptr + (q0 + tok)[:, None] * stride_ot + head[:, None] * D + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    out: torch.Tensor,
    tiles: torch.Tensor,
    count: torch.Tensor,
    ranges: torch.Tensor,
    cfg: AttentionConfig,
    anchor_at_query: bool = False,
) -> torch.Tensor:
    """Attention of every planned query tile; rows of `out` outside the tiles are left as they are.

    q/out [T, H, D]; k, v [T, KVH, D]; prefix_k/v [P, KVH, D] (at least one row); tiles [cap, 4] (the grid is
    `cap`, whatever `count` says); ranges [B, RANGES, 3]."""
    _, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if not (k.stride() == v.stride() == prefix_k.stride() == prefix_v.stride()) or k.stride()[1:] != (dim, 1):
        raise ValueError("tree_attention: K/V buffers need one row layout and contiguous head vectors")
    if q.stride()[1:] != (dim, 1) or out.stride()[1:] != (dim, 1) or out.shape != q.shape:
        raise ValueError("tree_attention: q and out need the [T, H, D] layout with contiguous heads")
    if v.shape != k.shape or prefix_v.shape != prefix_k.shape:
        raise ValueError("tree_attention: V buffers need the shapes of their K buffers")
    if max(t.shape[0] * t.stride(0) for t in (q, k, prefix_k, out)) >= OFFSET_LIMIT:  # keys span every row: no split
        raise ValueError(
            f"tree_attention: {q.shape[0]} tokens of {heads} heads pass the kernel's 32-bit offsets; lower "
            "tree_max_tokens or max_request_tokens"
        )
    f32 = cfg.precision == "f32"
    tree_attention_kernel[(tiles.shape[0], kv_heads)](
        q,
        k,
        v,
        prefix_k,
        prefix_v,
        out,
        tiles,
        count,
        ranges,
        q.stride(0),
        k.stride(0),
        out.stride(0),
        dim**-0.5 * math.log2(math.e),
        G=group,
        NT=cfg.tokens_per_tile(group),
        BM=cfg.bm,
        BN=cfg.bn,
        D=dim,
        KVH=kv_heads,
        N_RANGES=RANGES,
        PRECISION="tf32x3" if f32 else "ieee",
        F32=f32,
        ANCHOR_AT_QUERY=anchor_at_query,
        num_warps=cfg.warps,
        num_stages=cfg.stages,
    )
    return out
