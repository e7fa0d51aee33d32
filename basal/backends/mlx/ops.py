"""Batch-invariant building blocks in portable MLX ops — the same algorithm as the torch kernels
(`basal/backends/cuda/ops.py`): fixed-shape row chunks for every reduction, `exp` from exactly rounded
operations, RoPE from a per-position table, and tree attention over keys in position order in tiles of
`KEY_TILE` anchored at position 0 with an f32 online softmax.

MLX's own `mx.matmul` on Metal switches kernels with the row count, so fixed chunks matter there; mlx-cpu was
measured row-invariant, and runs the same code (docs/determinism.md §1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np

from basal.core.packing.attention_layout import KEY_TILE, AttentionLayout

ROWS = 64
READOUT_ROWS = 16
# MLX's Metal matmul switches to a gemv kernel for fewer rows (mlx/backend/metal/matmul.cpp), whose arithmetic
# depends on where a row sits; 16 is the first chunk size that never takes it, so no chunk may be smaller.
MIN_CHUNK_ROWS = 16
assert MIN_CHUNK_ROWS <= READOUT_ROWS <= ROWS, "matmul chunks under 16 rows take MLX's offset-dependent gemv"

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.1219444005469057e-04
_EXP_TAYLOR = [1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0]
_EXP_MIN, _EXP_MAX = -87.33654, 88.72284


def by_row_chunks(fn: Callable[[mx.array], mx.array], x: mx.array, rows: int) -> mx.array:
    """fn over fixed-shape chunks of `rows` rows (the last one zero-padded), so every call sees the same shape."""
    if rows < MIN_CHUNK_ROWS:
        raise ValueError(f"row chunks of {rows} < {MIN_CHUNK_ROWS}: MLX's Metal matmul would take its gemv kernel")
    n = x.shape[0]
    padded = -n % rows
    if padded:
        x = mx.concatenate([x, mx.zeros((padded, *x.shape[1:]), dtype=x.dtype)])
    out = mx.concatenate([fn(x[i : i + rows]) for i in range(0, x.shape[0], rows)])
    return out[:n]


def linear(x: mx.array, w_t: mx.array, b: mx.array | None, rows: int) -> mx.array:
    """x @ w_t (+ b); `w_t` is the transposed checkpoint weight [in, out]."""
    return by_row_chunks(lambda c: c @ w_t if b is None else c @ w_t + b, x, rows)


def rms_norm(x: mx.array, w: mx.array, eps: float, rows: int) -> mx.array:
    def norm(c: mx.array) -> mx.array:
        c32 = c.astype(mx.float32)
        c32 = c32 / mx.sqrt(mx.mean(c32 * c32, axis=-1, keepdims=True) + eps)
        return w * c32.astype(c.dtype)

    return by_row_chunks(norm, x, rows)


def det_exp(x: mx.array) -> mx.array:
    """exp from exactly rounded f32 operations (Cody–Waite + degree-7 Taylor), same recipe as the torch backend."""
    xc = mx.clip(x.astype(mx.float32), _EXP_MIN, _EXP_MAX)
    n = mx.round(xc * _LOG2E)
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = mx.full(r.shape, _EXP_TAYLOR[0], dtype=mx.float32)
    for c in _EXP_TAYLOR[1:]:
        p = p * r + c
    ni = n.astype(mx.int32)
    half = mx.right_shift(ni, 1)
    p = p * mx.view(mx.left_shift(half + 127, 23), mx.float32)
    p = p * mx.view(mx.left_shift(ni - half + 127, 23), mx.float32)
    p = mx.where(x < _EXP_MIN, 0.0, p)
    return mx.where(x > _EXP_MAX, mx.inf, p).astype(x.dtype)


def swiglu(gate_up: mx.array) -> mx.array:
    def one(gu: mx.array) -> mx.array:
        g, u = mx.split(gu, 2, axis=-1)
        g32 = g.astype(mx.float32)
        return (g32 / (1.0 + det_exp(-g32))).astype(g.dtype) * u

    return by_row_chunks(one, gate_up, ROWS)


def rope_tables(max_positions: int, head_dim: int, theta: float) -> tuple[mx.array, mx.array]:
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    freqs = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return mx.array(np.cos(emb)), mx.array(np.sin(emb))


def apply_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def tree_attention(
    q: mx.array, key_buf: mx.array, value_buf: mx.array, layout: AttentionLayout, query_rows: np.ndarray
) -> mx.array:
    """q [Nq, H, D] f32; key/value buffers [rows, KVH, D] f32; `query_rows` maps flat token -> row of q."""
    return gather_attention(list(attention_groups(q, key_buf, value_buf, layout, query_rows)), q.shape[1], q.shape[2])


def attention_groups(
    q: mx.array, key_buf: mx.array, value_buf: mx.array, layout: AttentionLayout, query_rows: np.ndarray
) -> Iterator[tuple[np.ndarray, mx.array]]:
    """Per group of query chunks: (rows of q it answers, their outputs [n, H, D]). A group's result does not
    depend on the other groups, so they can be evaluated one at a time (the CPU's step-aside points)."""
    n_q, heads, dim = q.shape
    kv_heads = key_buf.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5
    q_pad = mx.concatenate([q, mx.zeros((1, heads, dim), dtype=q.dtype)])
    for q_idx, q_pos, k_idx in layout.explicit():  # each group's key rows built when it is reached
        chunks, rows = q_idx.shape
        rows_in_q = np.where(q_pos >= 0, query_rows[q_idx], n_q)
        qs = q_pad[mx.array(rows_in_q)].reshape(chunks, rows, kv_heads, group, dim).transpose(0, 2, 3, 1, 4)
        qs = qs.reshape(chunks, kv_heads, group * rows, dim) * scale
        pos = mx.array(
            np.broadcast_to(q_pos[:, None, None, :], (chunks, 1, group, rows)).reshape(chunks, 1, group * rows, 1)
        )
        m = mx.full((chunks, kv_heads, group * rows, 1), -mx.inf)
        l_sum = mx.zeros((chunks, kv_heads, group * rows, 1))
        acc = mx.zeros((chunks, kv_heads, group * rows, dim))
        for t in range(0, k_idx.shape[1], KEY_TILE):
            tile = mx.array(k_idx[:, t : t + KEY_TILE])
            k = key_buf[tile].transpose(0, 2, 3, 1)  # [C, KVH, D, T]
            v = value_buf[tile].transpose(0, 2, 1, 3)  # [C, KVH, T, D]
            visible = mx.arange(t, t + KEY_TILE)[None, None, None, :] <= pos
            s = mx.where(visible, qs @ k, -mx.inf)
            m_tile = mx.max(s, axis=-1, keepdims=True)
            active = m_tile > -mx.inf
            m_new = mx.where(active, mx.maximum(m, m_tile), m)
            p = det_exp(s - mx.where(active, m_new, 0.0))
            alpha = det_exp(mx.where(active, m - m_new, 0.0))
            l_sum = mx.where(active, l_sum * alpha + mx.sum(p, axis=-1, keepdims=True), l_sum)
            acc = mx.where(active, acc * alpha + p @ v, acc)
            m = m_new
        res = acc / mx.where(l_sum > 0, l_sum, 1.0)
        res = res.reshape(chunks, kv_heads, group, rows, dim).transpose(0, 3, 1, 2, 4).reshape(chunks, rows, heads, dim)
        keep = q_pos >= 0
        yield (
            query_rows[q_idx[keep]],
            res.reshape(chunks * rows, heads, dim)[mx.array(np.flatnonzero(keep.reshape(-1)))],
        )


def gather_attention(parts: list[tuple[np.ndarray, mx.array]], heads: int, dim: int) -> mx.array:
    """The groups' outputs in query-row order."""
    if not parts:
        return mx.zeros((0, heads, dim))
    order = np.argsort(np.concatenate([rows for rows, _ in parts]))
    return mx.concatenate([vals for _, vals in parts])[mx.array(order)]
