"""Attention cases for the invariance checks: a query chain placed alone, inside a tree, or split differently, with
the Q/K/V rows of every token drawn from the chain's own values, so only the layout changes and the output must
not. The interpreter tests and bench/checks/gpu_check.py's P2 (on the GPU) run the same cases."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from basal.core.packing.tile_layout import lay_out_tiles
from basal.core.packing.tree import PackedForward


@dataclass
class Chain:
    """Q/K/V of one prompt at positions 0..n-1 (the first `prefix` of them cached in the prefix buffer)."""

    q: torch.Tensor  # [n, H, D]
    k: torch.Tensor  # [n, KVH, D]
    v: torch.Tensor
    prefix: int


def random_chain(n: int, prefix: int, heads: int, kv_heads: int, dim: int, seed: int, dtype=torch.float32) -> Chain:
    g = torch.Generator().manual_seed(seed)
    return Chain(
        torch.randn(n, heads, dim, generator=g).to(dtype),
        torch.randn(n, kv_heads, dim, generator=g).to(dtype),
        torch.randn(n, kv_heads, dim, generator=g).to(dtype),
        prefix,
    )


def layout(chain: Chain, cuts: list[int], siblings: list[int], seed: int):
    """Blocks of the chain's uncached tokens cut at `cuts` (positions), with a sibling of `siblings[i]` random
    tokens inserted before block i+1 (a child of block i). -> (batch, q, k, v, flat row of each chain position)."""
    n, p0 = chain.q.shape[0], chain.prefix
    edges = [p0, *cuts, n]
    g = torch.Generator().manual_seed(seed + 1)
    tokens_q, tokens_k, tokens_v, positions, block_of = [], [], [], [], []
    starts, lens, parents, prefix_of, row_of = [], [], [], [], {}

    def add_block(parent: int, pos: list[int], q, k, v) -> int:
        b = len(starts)
        starts.append(len(positions))
        lens.append(len(pos))
        parents.append(parent)
        prefix_of.append(0 if parent < 0 and p0 else -1)
        positions.extend(pos)
        block_of.extend([b] * len(pos))
        tokens_q.append(q)
        tokens_k.append(k)
        tokens_v.append(v)
        return b

    parent = -1
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        if i > 0 and i - 1 < len(siblings) and siblings[i - 1]:
            s = siblings[i - 1]
            sib = [torch.randn(s, *t.shape[1:], generator=g).to(t.dtype) for t in (chain.q, chain.k, chain.v)]
            add_block(parent, list(range(lo, lo + s)), *sib)
        row0 = len(positions)
        for j, p in enumerate(range(lo, hi)):
            row_of[p] = row0 + j
        parent = add_block(parent, list(range(lo, hi)), chain.q[lo:hi], chain.k[lo:hi], chain.v[lo:hi])

    def i32(x):
        return np.asarray(x, dtype=np.int32)

    n_tok = len(positions)
    batch = PackedForward(
        i32(np.zeros(n_tok)), i32(positions), i32(block_of), i32(starts), i32(lens), i32(parents),
        i32(prefix_of), ("pre",) if p0 else (), i32([row_of[n - 1]]), i32([]),
    )  # fmt: skip
    return batch, torch.cat(tokens_q), torch.cat(tokens_k), torch.cat(tokens_v), row_of


def plan_tensors(
    batch: PackedForward, prefix: int, tokens_per_tile: int, readout_only: bool = False, row: int | None = None
):
    """Tile table, count and chain ranges as tensors; `row`: only the tile holding that flat row (tiles are
    independent programs, and the interpreter runs them one at a time)."""
    plan = lay_out_tiles(batch, {"pre": (0, prefix)} if prefix else {}, tokens_per_tile)
    tiles = plan.readout_tiles if readout_only else plan.tiles
    if row is not None:
        tiles = tiles[(tiles[:, 0] <= row) & (row < tiles[:, 0] + tiles[:, 1])]
    return (
        torch.from_numpy(np.ascontiguousarray(tiles)),
        torch.tensor([len(tiles)], dtype=torch.int32),
        torch.from_numpy(np.ascontiguousarray(plan.ranges)),
    )


def reference(chain: Chain, p: int) -> torch.Tensor:
    """f64 attention of the query at position p over positions 0..p: [H, D]."""
    heads, kv_heads = chain.q.shape[1], chain.k.shape[1]
    q = chain.q[p].double()
    k = chain.k[: p + 1].double().repeat_interleave(heads // kv_heads, dim=1)  # [p+1, H, D]
    v = chain.v[: p + 1].double().repeat_interleave(heads // kv_heads, dim=1)
    s = torch.einsum("hd,khd->hk", q, k) * q.shape[-1] ** -0.5
    return torch.einsum("hk,khd->hd", s.softmax(-1), v)
