"""Which keys each query reads in a packed tree, as index arrays every backend can use (numpy only).

Queries are grouped by block into chunks of a fixed number of rows; every chunk lists its keys in position order
(ancestor blocks, then its own block; a cached template prefix first), padded to whole key tiles. Keys live in one
buffer per layer: row 0 is zeros (padding), then the cached prefixes, then the batch's own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basal.core.packing.tree import PackedBatch

KEY_TILE = 64  # attention key tile, anchored at position 0 — part of the numerics, never change it per batch
QUERY_ROWS = 64  # attention query chunk (inside one block)
TILE_GROUP = 32  # query chunks processed together per key tile (memory bound, not numerics)


@dataclass(frozen=True)
class AttentionPlan:
    """Per group of query chunks: the query rows, their positions (-1 = padding row) and the key rows in position
    order, padded to whole tiles. Built once per batch, reused by every layer."""

    groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (query idx [C,R], query pos [C,R], keys [C,L]) int64
    n_queries: int


def plan_attention(
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
) -> AttentionPlan:
    """Key index lists for `queries` (flat token indices), grouped by block into chunks of `rows` queries.

    `prefix_offset[p]` = (first buffer row, length) of cached prefix p; flat token i is buffer row flat_offset + i.
    """
    chain: dict[int, tuple[tuple[int, int], ...]] = {}

    def ranges_of(block: int) -> tuple[tuple[int, int], ...]:  # (first buffer row, rows) of positions 0 .. end
        if block not in chain:  # of `block`, in position order: ranges, not rows, so that a plan of many
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
        k_idx = np.zeros((len(part), width), dtype=np.int64)
        for c, (qs, pos, ranges, n_keys) in enumerate(part):
            q_idx[c, : len(qs)] = qs
            q_pos[c, : len(qs)] = pos
            at = 0
            for start, n in ranges:
                take = min(n, n_keys - at)
                if take <= 0:
                    break
                k_idx[c, at : at + take] = np.arange(start, start + take)
                at += take
        groups.append((q_idx, q_pos, k_idx))
    return AttentionPlan(groups, len(queries))


def plan_batch(batch: PackedBatch, prefix_lengths: dict[str, int]) -> tuple[AttentionPlan, AttentionPlan]:
    """Both plans a forward needs: every token as a query (layers before the last) and the readouts only (the last
    layer). `prefix_lengths` = tokens of each cached template prefix."""
    offsets, row = {}, 1
    for j, key in enumerate(batch.prefix_keys):
        offsets[j] = (row, prefix_lengths[key])
        row += prefix_lengths[key]
    args = (
        batch.block_of,
        batch.positions,
        batch.block_start,
        batch.block_len,
        batch.block_parent,
        batch.block_prefix,
        offsets,
        row,
    )
    return (
        plan_attention(*args, np.arange(batch.n_tokens), QUERY_ROWS),
        plan_attention(*args, batch.readouts.astype(np.int64), 1),
    )
