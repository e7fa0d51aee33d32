"""The first CPU tree attention: a Python loop over 64-key tiles (the baseline of issue 16).

Kept here, outside the package, as the bitwise reference the batched `kernels.tree_attention` is tested against
(tests/determinism/test_attention_equality.py) and as the "before" of `bench/lab/cpu_speed.py`.
"""

from __future__ import annotations

import torch

from basal.backends.cuda.ops import KEY_TILE, det_exp


def tiled_tree_attention(
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
