"""Which keys each query reads in a packed tree, as index arrays every backend can use (numpy only).

Queries are grouped by block into chunks of a fixed number of rows; every chunk reads its keys in position order
(ancestor blocks, then its own block; a cached template prefix first), padded to whole key tiles. Keys live in one
buffer per layer: row 0 is zeros (padding), then the cached prefixes, then the forward's own tokens.

A chunk's keys are a few contiguous runs of buffer rows (one per block of its chain), so the layout keeps them as
ranges: many questions on one state then cost a few integers per chunk, not a copy of the state's key rows each.
`key_rows` expands one group to explicit rows when a backend wants them, one group at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from basal.core.packing.tree import PackedForward

KEY_TILE = 64  # attention key tile, anchored at position 0 — part of the numerics, never change it per forward
QUERY_ROWS = 64  # attention query chunk (inside one block)
TILE_GROUP = 32  # query chunks processed together per key tile (memory bound, not numerics)


@dataclass(frozen=True)
class ChunkGroup:
    """Query chunks that run together. Chunk c reads `width` keys (whole tiles): key position p in
    [k_end[c, j-1], k_end[c, j]) is buffer row k_row[c, j] + p - k_end[c, j-1] (k_end[c, -1] = 0); positions past
    k_end[c, -1] read row 0, the zero row. Unused ranges are empty (same end as the range before)."""

    q_idx: np.ndarray  # [C, R] int64 flat token index of each query row
    q_pos: np.ndarray  # [C, R] int64 its position, -1 = padding row
    k_row: np.ndarray  # [C, S] int64 first buffer row of each key range
    k_end: np.ndarray  # [C, S] int64 key position where each range ends, non-decreasing along S
    width: int  # keys per chunk, a multiple of KEY_TILE

    def key_rows(self) -> np.ndarray:
        """[C, width] int64: the buffer row of every key of every chunk, position order."""
        return expand_ranges(self.k_row, self.k_end, self.width)


def expand_ranges(k_row: np.ndarray, k_end: np.ndarray, width: int) -> np.ndarray:
    """Explicit buffer rows [C, width] of key ranges (see `ChunkGroup`); row 0 past a chunk's last range. Each
    chunk's ranges, then one padding run up to `width`, laid end to end fill the rows exactly; a run's shift plus
    the key position is the row."""
    chunks = len(k_end)
    k_begin = np.concatenate([np.zeros((chunks, 1), dtype=np.int64), k_end[:, :-1]], axis=1)
    last = k_end[:, -1:]
    runs = np.concatenate([k_end - k_begin, width - last], axis=1)
    shift = np.concatenate([k_row - k_begin, np.zeros((chunks, 1), dtype=np.int64)], axis=1)
    p = np.arange(width, dtype=np.int64)
    rows = np.repeat(shift.ravel(), runs.ravel()).reshape(chunks, width) + p
    rows[p >= last] = 0
    return rows


def stack_ranges(ranges: list[tuple[tuple[int, int], ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk (first row, rows) runs in position order -> the (k_row, k_end) arrays of `ChunkGroup`."""
    width = max((len(r) for r in ranges), default=0) or 1
    k_row = np.zeros((len(ranges), width), dtype=np.int64)
    k_end = np.zeros((len(ranges), width), dtype=np.int64)
    for c, runs in enumerate(ranges):
        at = 0
        for j, (row, n) in enumerate(runs):
            k_row[c, j] = row
            at += n
            k_end[c, j] = at
        k_end[c, len(runs) :] = at
    return k_row, k_end


@dataclass(frozen=True)
class AttentionLayout:
    """Groups of up to `TILE_GROUP` query chunks with their key ranges. Built once per packed, reused by every
    layer."""

    groups: list[ChunkGroup]
    n_queries: int

    def explicit(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(query idx [C,R], query pos [C,R], key rows [C,L]) per group, each built when it is reached."""
        for g in self.groups:
            yield g.q_idx, g.q_pos, g.key_rows()


def lay_out_attention(
    block_of: np.ndarray,
    positions: np.ndarray,
    block_start: np.ndarray,
    block_len: np.ndarray,
    block_parent: np.ndarray,
    root_prefix: np.ndarray,
    prefix_offset: dict[int, tuple[int, int]],
    flat_offset: int,
    queries: np.ndarray,
    rows: int,
) -> AttentionLayout:
    """Key index lists for `queries` (flat token indices), grouped by block into chunks of `rows` queries.

    `prefix_offset[p]` = (first buffer row, length) of cached prefix p; flat token i is buffer row flat_offset + i.
    """
    chain: dict[int, tuple[tuple[int, int], ...]] = {}

    def ranges_of(block: int) -> tuple[tuple[int, int], ...]:  # (first buffer row, rows) of positions 0 .. end
        if block not in chain:  # of `block`, in position order: ranges, not rows, so that a layout of many
            parent = int(block_parent[block])  # questions on one state holds no copy of the state's keys per block
            if parent >= 0:
                head = ranges_of(parent)
            elif root_prefix[block] >= 0:
                head = (prefix_offset[int(root_prefix[block])],)
            else:
                head = ()
            chain[block] = (*head, (int(block_start[block]) + flat_offset, int(block_len[block])))
        return chain[block]

    chunks = []  # (query indices, positions, key ranges, keys read)
    by_block: dict[int, list[int]] = {}
    for q in queries.tolist():
        by_block.setdefault(int(block_of[q]), []).append(q)
    for block, qs in by_block.items():
        ranges = ranges_of(block)
        total = sum(n for _, n in ranges)
        for i in range(0, len(qs), rows):
            part = np.asarray(qs[i : i + rows])
            last = int(positions[part].max())
            chunks.append((part, positions[part], ranges, min(last + 1, total)))
    chunks.sort(key=lambda c: c[3])
    groups = []
    for g in range(0, len(chunks), TILE_GROUP):
        part = chunks[g : g + TILE_GROUP]
        width = -(-max(c[3] for c in part) // KEY_TILE) * KEY_TILE
        q_idx = np.zeros((len(part), rows), dtype=np.int64)
        q_pos = np.full((len(part), rows), -1, dtype=np.int64)
        for c, (qs, pos, _, _) in enumerate(part):
            q_idx[c, : len(qs)] = qs
            q_pos[c, : len(qs)] = pos
        k_row, k_end = stack_ranges([_cut(ranges, n_keys) for _, _, ranges, n_keys in part])
        groups.append(ChunkGroup(q_idx, q_pos, k_row, k_end, width))
    return AttentionLayout(groups, len(queries))


def _cut(ranges: tuple[tuple[int, int], ...], n_keys: int) -> tuple[tuple[int, int], ...]:
    """The first `n_keys` keys of a chain of ranges (the rest of a chunk's keys read the zero row)."""
    out, at = [], 0
    for start, n in ranges:
        take = min(n, n_keys - at)
        if take <= 0:
            break
        out.append((start, take))
        at += take
    return tuple(out)


def attention_layouts(packed: PackedForward, prefix_lengths: dict[str, int]) -> tuple[AttentionLayout, AttentionLayout]:
    """Both layouts a forward needs: every token as a query (layers before the last) and the readouts only (the last
    layer). `prefix_lengths` = tokens of each cached template prefix."""
    offsets, row = {}, 1
    for j, key in enumerate(packed.prefix_keys):
        offsets[j] = (row, prefix_lengths[key])
        row += prefix_lengths[key]
    args = (
        packed.block_of,
        packed.positions,
        packed.block_start,
        packed.block_len,
        packed.block_parent,
        packed.block_prefix,
        offsets,
        row,
    )
    return (
        lay_out_attention(*args, np.arange(packed.n_tokens), QUERY_ROWS),
        lay_out_attention(*args, packed.readouts.astype(np.int64), 1),
    )
