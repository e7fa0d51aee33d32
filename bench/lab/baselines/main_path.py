"""The torch CPU kernels as main had them before issue 16's second round (the batched tile-span attention, the
whole-tensor `det_exp`, GEMM chunks joined by `torch.cat`), kept outside the package as the bitwise reference the
current kernels are tested against (tests/determinism/test_attention_equality.py) and as the "before" of
`bench/lab/cpu_speed.py`. `installed()` swaps them into `basal.backends.cuda.ops` for the duration of a block.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager

import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda.cpu.gemm_chunks import ChunkSizes
from basal.backends.cuda.ops import _EXP_MAX, _EXP_MIN, _EXP_TAYLOR, _LN2_HI, _LN2_LO, _LOG2E, KEY_TILE
from basal.core.packing.attention_layout import AttentionLayout
from basal.core.packing.passes import run_to_end

ATTENTION_SPAN_BYTES = 192 << 20
ROWS = 64


def by_row_chunks(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows, fixed: bool = True
) -> torch.Tensor:
    return run_to_end(row_chunk_steps(fn, x, rows, fixed))


def row_chunk_steps(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int | ChunkSizes, fixed: bool = True
) -> Generator[None, None, torch.Tensor]:
    """`by_row_chunks`, yielding after every chunk (a pause point: the long lane may step aside there)."""
    n = x.shape[0]
    if not fixed:
        return fn(x)
    plan = rows if isinstance(rows, ChunkSizes) else ChunkSizes(rows, (rows,), True)
    sizes = plan.calls(n)
    padded = sum(sizes) - n
    if padded:
        x = torch.cat([x, x.new_zeros((padded, *x.shape[1:]))])
    out, start = [], 0
    for i, size in enumerate(sizes):
        out.append(fn(x[start : start + size]))
        start += size
        if i < len(sizes) - 1:
            yield
    return torch.cat(out)[:n]


def linear_steps(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    rows: int | ChunkSizes,
    fixed: bool = True,
    out: torch.Tensor | None = None,
) -> Generator[None, None, torch.Tensor]:
    """`out` is accepted for the current model's calls and not used: main's kernels returned new tensors."""
    del out
    return (yield from row_chunk_steps(lambda c: torch.nn.functional.linear(c, w, b), x, rows, fixed))


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, rows: int, fixed: bool = True) -> torch.Tensor:
    """Llama RMSNorm: reduce in f32, scale in the model dtype (as transformers does)."""

    def norm(c: torch.Tensor) -> torch.Tensor:
        c32 = c.float()
        c32 = c32 / torch.sqrt((c32 * c32).mean(-1, keepdim=True) + eps)  # sqrt and / are exactly rounded
        return w * c32.to(c.dtype)

    return by_row_chunks(norm, x, rows, fixed)


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


def swiglu(gate_up: torch.Tensor, fixed: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, 2F] = [gate | up] -> silu(gate) * up in the model dtype; silu in f32 with `det_exp`, computed in row
    chunks that stay in cache (`out` not used, as `linear_steps`)."""
    del out

    def one(gu: torch.Tensor) -> torch.Tensor:
        g, u = gu.chunk(2, dim=-1)
        g32 = g.float()
        return (g32 / (1.0 + det_exp(-g32, fixed))).to(g.dtype) * u

    return by_row_chunks(one, gate_up, ROWS)


def to_torch(plan: AttentionLayout, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [tuple(torch.from_numpy(a).to(device) for a in group) for group in plan.explicit()]


def tree_attention_steps(
    q: torch.Tensor,
    key_buf: torch.Tensor,
    value_buf: torch.Tensor,
    plan: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    query_rows: torch.Tensor,
    fixed: bool = True,
) -> Generator[None, None, torch.Tensor]:
    """`tree_attention`, yielding after every span of key tiles (a pause point).

    The arithmetic is the tile-by-tile online softmax of the first version (bench/lab/baselines/tiled_attention.py),
    op for op,
    so the bits are the same: per 64-key tile the scores are one [G*R, D] x [D, 64] GEMM, the running max, the
    exps and the row sums are elementwise or per row. What changes is that a span of tiles runs as one batched call
    of each op — the tile GEMMs keep their shape, only the batch grows — and only the f32 recurrence
    l = l * alpha + sum(p), acc = acc * alpha + p @ v, which is sequential by nature, steps through the tiles
    (four elementwise ops per tile instead of some forty). The running max is a cummax: max is exact, so
    batching it changes no bit.
    """
    n_q, heads, dim = q.shape
    kv_heads = key_buf.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5
    out = q.new_zeros(n_q, heads, dim)
    q_pad = torch.cat([q, q.new_zeros(1, heads, dim)])  # last row: the padding query
    for q_idx, q_pos, k_idx in plan:
        chunks, rows = q_idx.shape
        gr = group * rows
        rows_in_q = torch.where(q_pos >= 0, query_rows[q_idx], n_q)
        # [C, R, H, D] -> [C, KVH, G*R, D]: the G query heads that share a KV head are stacked along rows
        qs = q_pad[rows_in_q].view(chunks, rows, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
        qs = (qs.reshape(chunks, kv_heads, gr, dim) * scale)[:, :, None]  # [C, KVH, 1, G*R, D]
        pos = q_pos[:, None, None, :].expand(chunks, 1, group, rows).reshape(chunks, 1, 1, gr, 1)
        m = q.new_full((chunks, kv_heads, 1, gr, 1), float("-inf"))
        l_sum = q.new_zeros((chunks, kv_heads, gr, 1))
        acc = q.new_zeros((chunks, kv_heads, gr, dim))
        n_tiles = k_idx.shape[1] // KEY_TILE
        tile_bytes = 4 * chunks * kv_heads * KEY_TILE * (4 * gr + 4 * dim) + 8 * chunks * kv_heads * gr * dim
        span = max(1, min(n_tiles, ATTENTION_SPAN_BYTES // tile_bytes))
        for t0 in range(0, n_tiles, span):
            n_span = min(span, n_tiles - t0)
            keys = k_idx[:, t0 * KEY_TILE : (t0 + n_span) * KEY_TILE]
            k = key_buf[keys].view(chunks, n_span, KEY_TILE, kv_heads, dim).permute(0, 3, 1, 4, 2)  # [C,KVH,S,D,T]
            v = value_buf[keys].view(chunks, n_span, KEY_TILE, kv_heads, dim).permute(0, 3, 1, 2, 4)  # [C,KVH,S,T,D]
            key_pos = torch.arange(t0 * KEY_TILE, (t0 + n_span) * KEY_TILE, device=q.device).view(n_span, 1, KEY_TILE)
            visible = key_pos <= pos  # [C, 1, S, G*R, T]
            s = torch.matmul(qs, k).masked_fill(~visible, float("-inf"))  # [C, KVH, S, G*R, T]
            m_tile = s.amax(-1, keepdim=True)
            active = m_tile > float("-inf")  # rows with a visible key in this tile; others keep their bits
            m_run = torch.cummax(torch.cat([m, m_tile], dim=2), dim=2).values  # running max before/after each tile
            m_new = m_run[:, :, 1:]
            p = det_exp(s - torch.where(active, m_new, 0.0), fixed)
            alpha = det_exp(torch.where(active, m_run[:, :, :-1] - m_new, 0.0), fixed)
            p_sum = p.sum(-1, keepdim=True)
            pv = torch.matmul(p, v)  # [C, KVH, S, G*R, D]
            for j in range(n_span):
                a, al = active[:, :, j], alpha[:, :, j]
                l_sum = torch.where(a, l_sum * al + p_sum[:, :, j], l_sum)
                acc = torch.where(a, acc * al + pv[:, :, j], acc)
            m = m_run[:, :, -1:]
            yield
        res = acc / torch.where(l_sum > 0, l_sum, 1.0)  # [C, KVH, G*R, D]
        res = res.view(chunks, kv_heads, group, rows, dim).permute(0, 3, 1, 2, 4).reshape(chunks, rows, heads, dim)
        keep = q_pos >= 0
        out[query_rows[q_idx[keep]]] = res[keep]
    return out


KERNELS = ("row_chunk_steps", "linear_steps", "rms_norm", "det_exp", "swiglu", "to_torch", "tree_attention_steps")


@contextmanager
def installed() -> Iterator[None]:
    """Run the block with main's kernels in place of the current ones (the model calls them through `K.`)."""
    saved = {name: getattr(K, name) for name in KERNELS}
    for name in KERNELS:
        setattr(K, name, globals()[name])
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(K, name, fn)
