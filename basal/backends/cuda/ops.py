"""Batch-invariant building blocks for the torch backend (docs/determinism.md §1).

Library kernels pick their reduction strategy from the shape (torch CPU f32 GEMM has row-count classes {1},
{2,3}, {≥4}), so every op that reduces runs on **fixed-shape row chunks**: the rows are zero-padded to a
multiple of `rows` and the op is called on `[rows, ...]` slices. A row's result then depends only on that row
— not on how many other rows the forward has or where it sits — because every call has the same shape.
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

from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import torch

from basal.backends.cuda import tile_rows
from basal.backends.cuda.cpu import cpu_kernels
from basal.backends.cuda.cpu.gemm_chunks import ChunkSizes, column_spans, linear_into
from basal.core.packing.attention_layout import KEY_TILE, QUERY_ROWS, TILE_GROUP, AttentionLayout  # noqa: F401  (re-exported)
from basal.core.packing.passes import run_to_end

ROWS = 64  # fixed GEMM/norm chunk for all-token ops
READOUT_ROWS = 16  # fixed chunk for the last layer, which runs only at readout positions


def by_row_chunks(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int | ChunkSizes, fixed: bool = True
) -> torch.Tensor:
    """Apply `fn` to `x` in zero-padded chunks of exactly `rows` rows, or as a `ChunkSizes` says (fixed=False: one
    call, the negative control)."""
    return run_to_end(row_chunk_steps(fn, x, rows, fixed))


def row_chunk_steps(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int | ChunkSizes, fixed: bool = True
) -> Generator[None, None, torch.Tensor]:
    """`by_row_chunks`, yielding after every chunk (a pause point: the long lane may step aside there)."""
    if not fixed:
        return fn(x)
    return (yield from _chunk_steps(lambda c, out: out.copy_(fn(c)), x, rows, None))


def _chunk_steps(
    fn_into: Callable[[torch.Tensor, torch.Tensor], object],
    x: torch.Tensor,
    rows: int | ChunkSizes,
    width: int | None,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> Generator[None, None, torch.Tensor]:
    """Call `fn_into(chunk, out_rows)` on the row chunks of `x`, each writing its rows of one output tensor (no
    `torch.cat` of the pieces); only the tail chunk is copied to get its zero padding. `width`: output columns
    (None: as `x`). `out`: a buffer to write into (at least `padded_rows(len(x), rows)` rows), else a new tensor.
    Returns the first `len(x)` rows of the output."""
    n = x.shape[0]
    chunking = rows if isinstance(rows, ChunkSizes) else ChunkSizes(rows, (rows,), True)
    sizes = chunking.calls(n)
    if out is None:
        out = x.new_empty((sum(sizes), *(x.shape[1:] if width is None else (width,))), dtype=dtype or x.dtype)
    start = 0
    for i, size in enumerate(sizes):
        chunk = x[start : start + size]
        if chunk.shape[0] < size:
            chunk = torch.cat([chunk, x.new_zeros((size - chunk.shape[0], *x.shape[1:]))])
        fn_into(chunk, out[start : start + size])
        start += size
        if i < len(sizes) - 1:
            yield
    return out[:n]


def padded_rows(n: int, rows: int | ChunkSizes) -> int:
    """Rows `_chunk_steps` computes for `n` rows (the tail chunk padded): what an `out` buffer must hold."""
    chunking = rows if isinstance(rows, ChunkSizes) else ChunkSizes(rows, (rows,), True)
    return sum(chunking.calls(n))


def linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int | ChunkSizes, fixed: bool = True
) -> torch.Tensor:
    return run_to_end(linear_steps(x, w, b, rows, fixed))


def linear_steps(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    rows: int | ChunkSizes,
    fixed: bool = True,
    out: torch.Tensor | None = None,
) -> Generator[None, None, torch.Tensor]:
    """`F.linear` by row chunks, and by column blocks where the chunk sizes have them. Each chunk's GEMMs write into its
    rows of the output (`mm`/`addmm` with `out=`: the kernels `F.linear` itself calls on 2-D inputs, so the bits
    are the same); `out`: a buffer for it (`_chunk_steps`)."""
    if not fixed:
        return torch.nn.functional.linear(x, w, b)
    w_t = w.t()
    spans = column_spans(w.shape[0], rows.cols if isinstance(rows, ChunkSizes) else 0)

    def into(c: torch.Tensor, dest: torch.Tensor) -> None:
        linear_into(c, w_t, b, spans, dest)

    return (yield from _chunk_steps(into, x, rows, w.shape[0], out=out))


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, rows: int, fixed: bool = True) -> torch.Tensor:
    """Llama RMSNorm: reduce in f32, scale in the model dtype (as transformers does)."""

    def norm(c: torch.Tensor) -> torch.Tensor:
        c32 = c.float()
        c32 = c32 / torch.sqrt((c32 * c32).mean(-1, keepdim=True) + eps)  # sqrt and / are exactly rounded
        return c32.to(c.dtype)

    if not fixed:
        return w * norm(x)
    return run_to_end(_chunk_steps(lambda c, out: torch.mul(w, norm(c), out=out), x, rows, None))


# exp(x) = 2**n * exp(r), n = round(x / ln 2), r = x - n ln 2 (Cody–Waite: ln2_hi has 10 significant bits, so
# n * ln2_hi is exact for |n| < 2**14), exp(r) by a degree-7 Taylor polynomial on |r| <= ln 2 / 2 (remainder
# below 5e-9 relative). Every step is an exactly rounded f32 operation.
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.1219444005469057e-04
_EXP_TAYLOR = [1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0]
_EXP_MIN, _EXP_MAX = -87.33654, 88.72284  # below: 0 (no subnormals); above: inf
EXP_BLOCK = 1 << 20  # elements per pass of `det_exp`: its temporaries stay in cache (speed only, not numerics)


def det_exp(x: torch.Tensor, fixed: bool = True) -> torch.Tensor:
    """exp of an f32 tensor from exactly rounded operations only (+, *, round, exponent bits), so every element
    gets the same bits whatever the tensor's size or layout; within 2 ulp of the true value, flushing results
    below the smallest normal f32 to 0. `fixed=False` uses torch.exp (negative control).

    Elementwise, so it runs in blocks of `EXP_BLOCK` elements: some twenty passes over a block that stays in
    cache instead of over a tensor that does not."""
    if not fixed:
        return torch.exp(x)
    return _blocked(x.float(), _exp_into, x.dtype)


def det_exp_nonpositive(x: torch.Tensor, fixed: bool = True) -> torch.Tensor:
    """`det_exp` of an f32 tensor whose elements are all <= 0 or -inf (attention scores minus their running max):
    the same bits with fewer passes — no upper clamp, and 2**n, n in [-126, 0], is one normal f32 factor."""
    if not fixed:
        return torch.exp(x)
    return _blocked(x, _exp_nonpositive_into, x.dtype)


def _blocked(x: torch.Tensor, fn_into: Callable[[torch.Tensor, torch.Tensor], None], dtype) -> torch.Tensor:
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float32, device=x.device)
    for i in range(0, flat.numel(), EXP_BLOCK):
        fn_into(flat[i : i + EXP_BLOCK], out[i : i + EXP_BLOCK])
    return out.view(x.shape).to(dtype)


def _exp_reduced(x: torch.Tensor, xc: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Shared core: from the clamped `xc` (overwritten), `out` = exp(r) and the return value n = round(x log2 e)
    as f32; op for op the arithmetic of the first `det_exp`."""
    n = xc * _LOG2E
    n.round_()
    t = n * _LN2_HI
    r = xc.sub_(t)
    r.sub_(torch.mul(n, _LN2_LO, out=t))
    p = torch.mul(r, _EXP_TAYLOR[0], out=out)  # = full(c0) * r: IEEE products commute
    p.add_(_EXP_TAYLOR[1])
    for c in _EXP_TAYLOR[2:]:
        p.mul_(r).add_(c)
    return n


def _exp_into(x: torch.Tensor, out: torch.Tensor) -> None:
    n = _exp_reduced(x, x.clamp(_EXP_MIN, _EXP_MAX), out).to(torch.int32)
    half = n >> 1  # 2**n = 2**half * 2**(n - half): both factors stay normal for n in [-126, 128]
    n.sub_(half).add_(127).bitwise_left_shift_(23)
    half.add_(127).bitwise_left_shift_(23)
    out.mul_(half.view(torch.float32)).mul_(n.view(torch.float32))
    out.masked_fill_(x < _EXP_MIN, 0.0)
    out.masked_fill_(x > _EXP_MAX, float("inf"))


def _exp_nonpositive_into(x: torch.Tensor, out: torch.Tensor) -> None:
    # one factor 2**n: exact where the two-factor product is exact, and rounded once from the same value where
    # the result is subnormal (n = -126), as the second factor rounds it there
    n = _exp_reduced(x, x.clamp_min(_EXP_MIN), out).to(torch.int32)
    out.mul_(n.add_(127).bitwise_left_shift_(23).view(torch.float32))
    out.masked_fill_(x < _EXP_MIN, 0.0)


_NATIVE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # cpu_kernels.c's dtype codes


def swiglu(gate_up: torch.Tensor, fixed: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, 2F] = [gate | up] -> silu(gate) * up in the model dtype; silu in f32 with `det_exp`. Elementwise, so
    it runs in row blocks of about `EXP_BLOCK` gate elements that stay in cache, each writing its rows of the
    output (`out`: a buffer of at least N rows for it, else a new tensor)."""
    width = gate_up.shape[1] // 2
    if not fixed:
        g32 = gate_up[:, :width].float()
        return (g32 / (1.0 + torch.exp(-g32))).to(gate_up.dtype) * gate_up[:, width:]

    native = cpu_kernels.load() if gate_up.device.type == "cpu" else None
    code = _NATIVE_DTYPES.get(gate_up.dtype)
    if native is not None and code is not None:  # the same ops, one pass per element (cpu_kernels.c)
        gate_up = gate_up.contiguous()
        out = gate_up.new_empty(len(gate_up), width) if out is None else out[: len(gate_up)]
        cpu_kernels.run_rows(native.basal_swiglu, (gate_up.data_ptr(), out.data_ptr(), width, code), len(gate_up))
        return out

    def into(gu: torch.Tensor, out: torch.Tensor) -> None:
        g32 = gu[:, :width].float()
        neg = torch.neg(g32)
        e = torch.empty_like(neg)
        _exp_into(neg.view(-1), e.view(-1))
        e.add_(1.0)  # = 1.0 + e
        torch.mul(torch.div(g32, e, out=e).to(gu.dtype), gu[:, width:], out=out)

    block = max(1, min(len(gate_up), EXP_BLOCK // width))
    if out is not None and len(out) < padded_rows(len(gate_up), block):
        out = None  # the padded tail block would not fit
    return run_to_end(_chunk_steps(into, gate_up, block, width, out=out))


def rope_tables(max_positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_positions, head_dim] f32 (rotate-half layout, as transformers), computed once per model so a
    position's values never depend on the forward that reads them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim] in the model dtype (its rows may be a column slice of the q/k/v GEMM's output),
    cos/sin [N, head_dim] f32 -> f32 [N, heads, head_dim]. On the CPU with the compiled kernels, the conversion,
    both products and the sum are one pass (cpu_kernels.c), with the same operations."""
    n, heads, dim = x.shape
    native = cpu_kernels.load() if x.device.type == "cpu" else None
    code = _NATIVE_DTYPES.get(x.dtype)
    if native is not None and code is not None and x.stride(2) == 1 and x.stride(1) == dim and dim % 2 == 0:
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        assert cos.shape == sin.shape == (n, dim), (cos.shape, x.shape)
        out = torch.empty(n, heads, dim, dtype=torch.float32)
        args = (x.data_ptr(), x.stride(0), code, cos.data_ptr(), sin.data_ptr(), out.data_ptr(), heads, dim)
        cpu_kernels.run_rows(native.basal_rope, args, n)
        return out
    x = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


@dataclass(frozen=True)
class AttentionGroup:
    """Query chunks that run together: all need the same number of key tiles, and only their first `rows_used`
    rows hold queries. The tile GEMMs keep the layout's full chunk shape (their bits are the reference); every other
    op runs on the used rows and the needed tiles only. Keys are the layout's ranges (`ChunkGroup`), expanded to
    explicit rows by `key_rows` one group at a time."""

    q_idx: torch.Tensor  # [C, R] flat token index of each query row
    q_pos: torch.Tensor  # [C, R] its position, -1 = padding row
    k_row: torch.Tensor  # [C, S] first buffer row of each key range
    k_end: torch.Tensor  # [C, S] key position where each range ends (non-decreasing); past the last: row 0
    rows_used: int
    n_keys: int  # keys read per chunk: tiles * KEY_TILE

    def key_rows(self) -> torch.Tensor:
        """[C, n_keys] int64: the buffer row of every key of every chunk, position order (row 0 past a chunk's
        last range). Each chunk's ranges, then one padding run up to n_keys, laid end to end fill the
        [C, n_keys] rows exactly; a run's shift plus the key position is the row."""
        chunks = self.k_end.shape[0]
        k_begin = torch.cat([self.k_end.new_zeros(chunks, 1), self.k_end[:, :-1]], dim=1)
        last = self.k_end[:, -1:]
        runs = torch.cat([self.k_end - k_begin, self.n_keys - last], dim=1)
        shift = torch.cat([self.k_row - k_begin, self.k_end.new_zeros(chunks, 1)], dim=1)
        p = torch.arange(self.n_keys, device=self.k_end.device)
        rows = torch.repeat_interleave(shift.view(-1), runs.view(-1), output_size=chunks * self.n_keys)
        return rows.view(chunks, self.n_keys).add_(p).masked_fill_(p >= last, 0)


GROUP_PADDING = 1 / 8  # most padding rows a regrouped group may hold, as a share of its rows (speed only)


def to_torch(layout: AttentionLayout, device: torch.device) -> list[AttentionGroup]:
    """The layout's chunks regrouped for the CPU kernel: by the key tiles each chunk needs (a tile past a chunk's
    last query position is masked for every row, and a tile no row sees changes no bit, so it is left out) and,
    within that, by how many rows hold queries. Up to `TILE_GROUP` chunks per group, as in the layout, and a group
    ends where its padding (rows up to its widest chunk's) would pass `GROUP_PADDING` of its rows: a group runs
    every chunk at its widest chunk's rows, so a 64-row chunk in a group of 17-row questions nearly quadrupled
    the group's tile work. A chunk's rows have the same bits in any group (`tile_rows.py` proves the GEMMs'
    used-row counts; the rest is per row). Key ranges stay ranges: a chunk's keys past its needed tiles are past
    its last query, so the layout's ranges already end there."""
    chunks = []
    for g in layout.groups:
        for c in range(g.q_idx.shape[0]):
            used = int((g.q_pos[c] >= 0).sum())
            tiles = -(-(int(g.q_pos[c].max()) + 1) // KEY_TILE)
            chunks.append((tiles, used, g.q_idx[c], g.q_pos[c], g.k_row[c], g.k_end[c]))
    chunks.sort(key=lambda c: (c[0], c[1]))
    groups, start = [], 0
    while start < len(chunks):
        end, rows = start + 1, chunks[start][1]
        while end < len(chunks) and end - start < TILE_GROUP and chunks[end][0] == chunks[start][0]:
            used = chunks[end][1]  # the group's widest chunk so far: the others' rows up to it are padding
            if (end - start + 1) * used * (1 - GROUP_PADDING) > rows + used:
                break
            rows += used
            end += 1
        part = chunks[start:end]
        q_idx, q_pos = (torch.from_numpy(np.stack([c[i] for c in part])).to(device) for i in (2, 3))
        n_ranges = max(len(c[4]) for c in part)
        k_row = np.zeros((len(part), n_ranges), dtype=np.int64)
        k_end = np.zeros((len(part), n_ranges), dtype=np.int64)
        for i, c in enumerate(part):  # layout groups may differ in ranges: pad with empty ranges at the end
            k_row[i, : len(c[4])], k_end[i, : len(c[5])], k_end[i, len(c[5]) :] = c[4], c[5], c[5][-1]
        ranges = (torch.from_numpy(a).to(device) for a in (k_row, k_end))
        groups.append(AttentionGroup(q_idx, q_pos, *ranges, max(c[1] for c in part), part[0][0] * KEY_TILE))
        start = end
    return groups


ATTENTION_SPAN_BYTES = 16 << 20  # working set of one batched span of key tiles (speed only, not numerics)


def tree_attention(
    q: torch.Tensor,
    key_buf: torch.Tensor,
    value_buf: torch.Tensor,
    groups: list[AttentionGroup],
    query_rows: torch.Tensor,
    fixed: bool = True,
) -> torch.Tensor:
    """Attention of the planned queries. q [Nq, H, D] f32 indexed by `query_rows` order; key/value buffers
    [rows, KVH, D] f32. Returns [Nq, H, D] f32 in the order of `groups`' query indices mapped through
    `query_rows` (flat token index -> row of q)."""
    return run_to_end(tree_attention_steps(q, key_buf, value_buf, groups, query_rows, fixed))


def tree_attention_steps(
    q: torch.Tensor,
    key_buf: torch.Tensor,
    value_buf: torch.Tensor,
    groups: list[AttentionGroup],
    query_rows: torch.Tensor,
    fixed: bool = True,
) -> Generator[None, None, torch.Tensor]:
    """`tree_attention`, yielding after every span of key tiles (a pause point).

    The arithmetic is the tile-by-tile online softmax of the first version (bench/lab/baselines/tiled_attention.py),
    op for op,
    so the bits are the same: per 64-key tile the scores are one [G*R, D] x [D, 64] GEMM, the running max, the
    exps and the row sums are elementwise or per row. A span of tiles runs as one batched call of each op — the
    tile GEMMs keep their shape, only the forward grows — and only the f32 recurrence l = l * alpha + sum(p),
    acc = acc * alpha + p @ v, which is sequential by nature, steps through the tiles. The running max is a
    cummax: max is exact, so batching it changes no bit. Between the two GEMMs only the group's used rows are
    kept (rows past them are padding: masked everywhere, their results dropped), and exp is
    `det_exp_nonpositive`: the scores minus their running max are never positive.

    On the CPU, with the compiled kernels (`cpu_kernels.py`), everything between the two GEMMs — the recurrence's
    tile loop included — is one C pass per row with the same operations; the GEMMs run on the used rows only
    where `tile_rows.py`'s probe shows that keeps their bits.
    """
    n_q, heads, dim = q.shape
    kv_heads = key_buf.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5
    exp = det_exp_nonpositive if fixed else torch.exp
    native = cpu_kernels.load() if fixed and q.device.type == "cpu" else None
    out = q.new_zeros(n_q, heads, dim)
    q_pad = torch.cat([q, q.new_zeros(1, heads, dim)])  # last row: the padding query
    for g in groups:
        q_idx, q_pos, k_idx, used = g.q_idx, g.q_pos, g.key_rows(), g.rows_used
        chunks, rows = q_idx.shape
        # the tile GEMMs' rows per chunk: the used ones where that keeps every row's bits (tile_rows.py), else all
        probed = tile_rows.invariant_rows(group, dim, kv_heads, rows, KEY_TILE, str(q.device), torch.get_num_threads())
        gemm_rows = used if used in probed else rows
        gr = group * gemm_rows
        rows_in_q = torch.where(q_pos >= 0, query_rows[q_idx], n_q)[:, :gemm_rows]
        # [C, M, H, D] -> [C, KVH, G*M, D]: the G query heads that share a KV head are stacked along rows
        qs = q_pad[rows_in_q].view(chunks, gemm_rows, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
        qs = (qs.reshape(chunks, kv_heads, gr, dim) * scale)[:, :, None]  # [C, KVH, 1, G*M, D]
        pos = q_pos[:, None, None, None, :used, None]  # [C, 1, 1, 1, U, 1]
        m = q.new_full((chunks, kv_heads, 1, group, used, 1), float("-inf"))
        l_sum = q.new_zeros((chunks, kv_heads, group, used, 1))
        acc = q.new_zeros((chunks, kv_heads, group, used, dim))
        n_tiles = k_idx.shape[1] // KEY_TILE
        if native is not None:  # the compiled path keeps m, l and acc in the same memory layout, [C, KVH, G, U]
            m = m.view(chunks, kv_heads, group, used).contiguous()
            q_pos_c = q_pos.to(torch.int64).contiguous()
            k_idx_c = k_idx.to(torch.int64).contiguous()
            ptr = cpu_kernels.ptr
            p_buffers: dict[int, torch.Tensor] = {}
        tile_bytes = 4 * chunks * kv_heads * (KEY_TILE * (2 * gr + 4 * group * used + 2 * dim) + gr * dim)
        span = max(1, min(n_tiles, ATTENTION_SPAN_BYTES // tile_bytes))
        for t0 in range(0, n_tiles, span):
            n_span = min(span, n_tiles - t0)
            keys = k_idx[:, t0 * KEY_TILE : (t0 + n_span) * KEY_TILE]
            # contiguous: with one chunk and one tile the permuted view is a valid strided batch, and matmul would
            # run it as a transposed GEMM, whose bits differ from the copied layout every other group gets
            if native is not None:  # the same tensors, gathered in one pass (cpu_kernels.c)
                k = q.new_empty(chunks, kv_heads, n_span, dim, KEY_TILE)
                v = q.new_empty(chunks, kv_heads, n_span, KEY_TILE, dim)
                shape = (kv_heads, n_span, KEY_TILE, dim, k_idx_c.shape[1], t0 * KEY_TILE)
                args = (ptr(key_buf), ptr(value_buf), ptr(k_idx_c), ptr(k), ptr(v), *shape)
                cpu_kernels.run_rows(native.basal_gather_kv, args, chunks * kv_heads * n_span, grain=1)
            else:
                k = key_buf[keys].view(chunks, n_span, KEY_TILE, kv_heads, dim).permute(0, 3, 1, 4, 2).contiguous()
                v = value_buf[keys].view(chunks, n_span, KEY_TILE, kv_heads, dim).permute(0, 3, 1, 2, 4).contiguous()
            if native is not None:
                p_rows = p_buffers.get(n_span)
                if p_rows is None:  # padding rows are never written: they stay zero for every span of the group
                    new = q.new_zeros if used < gemm_rows else q.new_empty
                    p_rows = p_buffers[n_span] = new(chunks, kv_heads, n_span, group, gemm_rows, KEY_TILE)
                s = torch.matmul(qs, k)
                _native_span(native, s, p_rows, v, q_pos_c, rows, m, l_sum, acc, used, t0 * KEY_TILE)
                yield
                continue
            key_pos = torch.arange(t0 * KEY_TILE, (t0 + n_span) * KEY_TILE, device=q.device)
            visible = key_pos.view(n_span, 1, 1, KEY_TILE) <= pos  # [C, 1, S, 1, U, T]
            s = torch.matmul(qs, k).view(chunks, kv_heads, n_span, group, gemm_rows, KEY_TILE)[..., :used, :]
            s = torch.where(visible, s, float("-inf"))  # [C, KVH, S, G, U, T]
            m_tile = s.amax(-1, keepdim=True)
            active = m_tile > float("-inf")  # rows with a visible key in this tile; others keep their bits
            m_run = torch.cummax(torch.cat([m, m_tile], dim=2), dim=2).values  # running max before/after each tile
            m_new = m_run[:, :, 1:]
            p = exp(s.sub_(torch.where(active, m_new, 0.0)))
            alpha = exp(torch.where(active, m_run[:, :, :-1] - m_new, 0.0))
            p_sum = p.sum(-1, keepdim=True)
            if used < gemm_rows:  # the GEMM's full row shape; padding rows of p stay zero
                p_rows = p.new_zeros(chunks, kv_heads, n_span, group, gemm_rows, KEY_TILE)
                p_rows[..., :used, :] = p
                p = p_rows
            pv = torch.matmul(p.view(chunks, kv_heads, n_span, gr, KEY_TILE), v)
            pv = pv.view(chunks, kv_heads, n_span, group, gemm_rows, dim)[..., :used, :]  # [C, KVH, S, G, U, D]
            for j in range(n_span):
                a, al = active[:, :, j], alpha[:, :, j]
                l_sum = torch.where(a, l_sum * al + p_sum[:, :, j], l_sum)
                acc = torch.where(a, acc * al + pv[:, :, j], acc)
            m = m_run[:, :, -1:]
            yield
        l_sum = l_sum.view(chunks, kv_heads, group, used, 1)
        res = acc / torch.where(l_sum > 0, l_sum, 1.0)  # [C, KVH, G, U, D]
        res = res.permute(0, 3, 1, 2, 4).reshape(chunks, used, heads, dim)
        keep = q_pos[:, :used] >= 0
        out[query_rows[q_idx[:, :used][keep]]] = res[keep]
    return out


def _native_span(
    lib,
    s: torch.Tensor,
    p_rows: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    q_rows: int,
    m: torch.Tensor,
    l_sum: torch.Tensor,
    acc: torch.Tensor,
    used: int,
    key0: int,
) -> None:
    """One span of `tree_attention_steps` with the compiled kernels: the same ops, with the mask, max, exps and
    the tile-by-tile recurrence each one pass in C (cpu_kernels.c); updates m, l_sum and acc in place.
    s [C, KVH, S, G*M, T] from the score GEMM (M rows per chunk); p_rows [C, KVH, S, G, M, T] with zero padding
    rows; q_pos [C, q_rows] the layout's positions."""
    chunks, kv_heads, n_span, group, rows, tile = p_rows.shape
    dim = v.shape[-1]
    alpha = s.new_empty(chunks, kv_heads, n_span, group, used)
    active = torch.empty(alpha.shape, dtype=torch.uint8)
    n_rows = chunks * kv_heads * group * used
    ptr = cpu_kernels.ptr
    shape = (chunks, kv_heads, n_span, group, rows, used)
    args = (ptr(s), ptr(p_rows), ptr(alpha), ptr(active), ptr(m), ptr(q_pos), q_rows, *shape, tile, key0)
    cpu_kernels.run_rows(lib.basal_softmax_span, args, n_rows)
    p_sum = p_rows[..., :used, :].sum(-1).contiguous()  # [C, KVH, S, G, U]: torch's row sum, as the torch path
    pv = torch.matmul(p_rows.view(chunks, kv_heads, n_span, group * rows, tile), v)  # [C, KVH, S, G*R, D]
    args = (ptr(alpha), ptr(active), ptr(p_sum), ptr(pv), ptr(l_sum), ptr(acc), *shape, dim)
    cpu_kernels.run_rows(lib.basal_recurrence_span, args, n_rows)
