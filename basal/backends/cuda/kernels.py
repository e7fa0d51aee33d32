"""Batch-invariant building blocks for the torch backend (backends-determinism.md §0, §6).

Library kernels pick their reduction strategy from the shape (torch CPU f32 GEMM has row-count classes {1},
{2,3}, {≥4}), so every op that reduces runs on **fixed-shape row chunks**: the rows are zero-padded to a
multiple of `rows` and the op is called on `[rows, ...]` slices. A row's result then depends only on that row
— not on how many other rows the batch has or where it sits — because every call has the same shape.
Elementwise ops (RoPE, SiLU, residual adds) are invariant at any shape.

Transcendental elementwise ops are *not* invariant on the CPU: torch runs SIMD (Sleef) code for most elements
and a scalar libm tail for the rest, and which elements fall in the tail depends on the tensor's size (measured:
``silu`` of a row differs between a 233-row and a 64-row tensor). So `exp` is computed here from exactly
rounded operations only (`det_exp`), and RoPE reads a cos/sin table computed once per position.

Attention visits each query's keys in position order, in tiles of `KEY_TILE` keys anchored at position 0, with
an f32 online softmax; query rows are processed in fixed chunks of `rows`, so a query's arithmetic is the same
whether its block holds one token or thousands.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from basal.core.attention_plan import KEY_TILE, QUERY_ROWS, AttentionPlan  # noqa: F401  (re-exported)

ROWS = 64  # fixed GEMM/norm chunk for all-token ops
READOUT_ROWS = 16  # fixed chunk for the last layer, which runs only at readout positions


def by_row_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int, fixed: bool = True):
    """Apply `fn` to `x` in zero-padded chunks of exactly `rows` rows (fixed=False: one call, the negative control)."""
    n = x.shape[0]
    if not fixed:
        return fn(x)
    padded = -n % rows
    if padded:
        x = torch.cat([x, x.new_zeros((padded, *x.shape[1:]))])
    out = torch.cat([fn(x[i : i + rows]) for i in range(0, x.shape[0], rows)])
    return out[:n]


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int, fixed: bool = True) -> torch.Tensor:
    return by_row_chunks(lambda c: torch.nn.functional.linear(c, w, b), x, rows, fixed)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, rows: int, fixed: bool = True) -> torch.Tensor:
    """Llama RMSNorm: reduce in f32, scale in the model dtype (as transformers does)."""

    def norm(c: torch.Tensor) -> torch.Tensor:
        c32 = c.float()
        c32 = c32 / torch.sqrt((c32 * c32).mean(-1, keepdim=True) + eps)  # sqrt and / are exactly rounded
        return w * c32.to(c.dtype)

    return by_row_chunks(norm, x, rows, fixed)


# exp(x) = 2**n * exp(r), n = round(x / ln 2), r = x - n ln 2 (Cody–Waite: ln2_hi has 10 significant bits, so
# n * ln2_hi is exact for |n| < 2**14), exp(r) by a degree-7 Taylor polynomial on |r| <= ln 2 / 2 (remainder
# below 5e-9 relative). Every step is an exactly rounded f32 operation.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.1219444005469057e-04
_EXP_TAYLOR = [1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0]
_EXP_MIN, _EXP_MAX = -87.33654, 88.72284  # below: 0 (no subnormals); above: inf


def det_exp(x: torch.Tensor, fixed: bool = True) -> torch.Tensor:
    """exp of an f32 tensor from exactly rounded operations only (+, *, round, exponent bits), so every element
    gets the same bits whatever the tensor's size or layout; within 2 ulp of the true value, flushing results
    below the smallest normal f32 to 0. `fixed=False` uses torch.exp (negative control)."""
    if not fixed:
        return torch.exp(x)
    xc = x.float().clamp(_EXP_MIN, _EXP_MAX)
    n = torch.round(xc * _LOG2E)
    r = xc - n * _LN2_HI
    r -= n * _LN2_LO
    p = torch.full_like(r, _EXP_TAYLOR[0])
    for c in _EXP_TAYLOR[1:]:
        p.mul_(r).add_(c)
    n = n.to(torch.int32)
    half = n >> 1  # 2**n = 2**half * 2**(n - half): both factors stay normal for n in [-126, 128]
    p.mul_(((half + 127) << 23).view(torch.float32)).mul_(((n - half + 127) << 23).view(torch.float32))
    p.masked_fill_(x < _EXP_MIN, 0.0)
    p.masked_fill_(x > _EXP_MAX, float("inf"))
    return p.to(x.dtype)


def swiglu(gate_up: torch.Tensor, fixed: bool = True) -> torch.Tensor:
    """[N, 2F] = [gate | up] -> silu(gate) * up in the model dtype; silu in f32 with `det_exp`, computed in row
    chunks that stay in cache."""

    def one(gu: torch.Tensor) -> torch.Tensor:
        g, u = gu.chunk(2, dim=-1)
        g32 = g.float()
        return (g32 / (1.0 + det_exp(-g32, fixed))).to(g.dtype) * u

    return by_row_chunks(one, gate_up, ROWS)


def rope_tables(max_positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_positions, head_dim] f32 (rotate-half layout, as transformers), computed once per model so a
    position's values never depend on the batch that reads them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim] f32."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def to_torch(plan: AttentionPlan, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [tuple(torch.from_numpy(a).to(device) for a in group) for group in plan.groups]


def tree_attention(
    q: torch.Tensor,
    key_buf: torch.Tensor,
    value_buf: torch.Tensor,
    plan: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    query_rows: torch.Tensor,
    fixed: bool = True,
) -> torch.Tensor:
    """Attention of the planned queries. q [Nq, H, D] f32 indexed by `query_rows` order; key/value buffers
    [rows, KVH, D] f32. Returns [Nq, H, D] f32 in the order of `plan`'s query indices mapped through
    `query_rows` (flat token index -> row of q)."""
    n_q, heads, dim = q.shape
    kv_heads = key_buf.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5
    out = q.new_zeros(n_q, heads, dim)
    q_pad = torch.cat([q, q.new_zeros(1, heads, dim)])  # last row: the padding query
    for q_idx, q_pos, k_idx in plan:
        chunks, rows = q_idx.shape
        rows_in_q = torch.where(q_pos >= 0, query_rows[q_idx], n_q)
        # [C, R, H, D] -> [C, KVH, G*R, D]: the G query heads that share a KV head are stacked along rows
        qs = q_pad[rows_in_q].view(chunks, rows, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
        qs = qs.reshape(chunks, kv_heads, group * rows, dim) * scale
        pos = q_pos[:, None, None, :].expand(chunks, 1, group, rows).reshape(chunks, 1, group * rows, 1)
        m = q.new_full((chunks, kv_heads, group * rows, 1), float("-inf"))
        l_sum = q.new_zeros((chunks, kv_heads, group * rows, 1))
        acc = q.new_zeros((chunks, kv_heads, group * rows, dim))
        for t in range(0, k_idx.shape[1], KEY_TILE):
            tile = k_idx[:, t : t + KEY_TILE]
            k = key_buf[tile].permute(0, 2, 3, 1)  # [C, KVH, D, T]
            v = value_buf[tile].permute(0, 2, 1, 3)  # [C, KVH, T, D]
            key_pos = torch.arange(t, t + KEY_TILE, device=q.device)
            visible = key_pos[None, None, None, :] <= pos  # [C, 1, G*R, T]
            s = torch.matmul(qs, k).masked_fill(~visible, float("-inf"))
            m_tile = s.amax(-1, keepdim=True)
            active = m_tile > float("-inf")  # rows with a visible key in this tile; others keep their bits
            m_new = torch.where(active, torch.maximum(m, m_tile), m)
            p = det_exp(s - torch.where(active, m_new, 0.0), fixed)
            alpha = det_exp(torch.where(active, m - m_new, 0.0), fixed)
            l_sum = torch.where(active, l_sum * alpha + p.sum(-1, keepdim=True), l_sum)
            acc = torch.where(active, acc * alpha + torch.matmul(p, v), acc)
            m = m_new
        res = acc / torch.where(l_sum > 0, l_sum, 1.0)  # [C, KVH, G*R, D]
        res = res.view(chunks, kv_heads, group, rows, dim).permute(0, 3, 1, 2, 4).reshape(chunks, rows, heads, dim)
        keep = q_pos >= 0
        out[query_rows[q_idx[keep]]] = res[keep]
    return out
