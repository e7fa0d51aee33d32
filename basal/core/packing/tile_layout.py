"""Query tiles and block chain ranges of a packed tree, for GPU tree attention (docs/gpu-path.md §3.2, §4; numpy only).

A sibling of `attention_layout`: instead of per-query key index lists it emits, per packed,
- a **tile table** `(q0, nq, pos0, block)`: `nq` consecutive tokens of one block (at most NT per tile), starting at
  flat row `q0` and position `pos0`;
- a **chain range table** `[blocks, RANGES, 3]` of `(logical_start, base, phys_start)`: a key at position `kp` of a
  block's chain lives in the range with the largest `logical_start <= kp`, at row `phys_start + kp - logical_start`
  of buffer `base` (0 = the cached template prefixes, 1 = the forward's own tokens). Unused ranges start at
  `NO_RANGE`, so they never match.

The metadata is O(blocks × RANGES), not O(keys): a 16k-token state would need ~16M key indices otherwise.
Everything goes to the device as one contiguous int32 blob with capacities fixed per bucket, so a CUDA graph
captured for a bucket reads every forward of that bucket from the same addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basal.core.packing.tree import MAX_DEPTH, PackedForward

RANGES = MAX_DEPTH + 1  # one cached-prefix range plus one per tree level
NO_RANGE = 2**30  # logical start of an unused range: larger than any position
PREFIX_BUFFER, BATCH_BUFFER = 0, 1
COUNTS = 4  # blob header: n_tiles, n_readout_tiles, n_tokens, n_readouts


@dataclass(frozen=True)
class TileLayout:
    tiles: np.ndarray  # [n_tiles, 4] int32 (q0, nq, pos0, block): every token as a query
    readout_tiles: np.ndarray  # [R, 4] int32: one tile per readout (nq = 1)
    ranges: np.ndarray  # [B, RANGES, 3] int32 (logical_start, base, phys_start)


def chain_ranges(packed: PackedForward, prefix_rows: dict[str, tuple[int, int]]) -> np.ndarray:
    """[B, RANGES, 3]. `prefix_rows[key]` = (first row, length) of a cached prefix in the prefix buffer."""
    n_blocks = len(packed.block_start)
    out = np.zeros((n_blocks, RANGES, 3), dtype=np.int32)
    out[:, :, 0] = NO_RANGE
    for b in range(n_blocks):
        chain = packed.chain(b)
        if len(chain) > MAX_DEPTH:
            raise ValueError(f"block chain of depth {len(chain)} > {MAX_DEPTH}; the packer limits it")
        r = 0
        root_prefix = int(packed.block_prefix[chain[0]])
        if root_prefix >= 0:
            row, _ = prefix_rows[packed.prefix_keys[root_prefix]]
            out[b, 0] = (0, PREFIX_BUFFER, row)
            r = 1
        for c in chain:
            start = int(packed.block_start[c])
            out[b, r] = (int(packed.positions[start]), BATCH_BUFFER, start)
            r += 1
    return out


def lay_out_tiles(packed: PackedForward, prefix_rows: dict[str, tuple[int, int]], tokens_per_tile: int) -> TileLayout:
    """Tiles of at most `tokens_per_tile` tokens that never mix blocks, readout tiles, chain ranges."""
    tiles = []
    for b, (start, length) in enumerate(zip(packed.block_start.tolist(), packed.block_len.tolist(), strict=True)):
        for q0 in range(start, start + length, tokens_per_tile):
            tiles.append((q0, min(tokens_per_tile, start + length - q0), int(packed.positions[q0]), b))
    readouts = packed.readouts.astype(np.int64)
    readout_tiles = np.stack(
        [readouts, np.ones_like(readouts), packed.positions[readouts], packed.block_of[readouts]], axis=1
    ).astype(np.int32)
    return TileLayout(
        np.asarray(tiles, dtype=np.int32).reshape(-1, 4),
        readout_tiles.reshape(-1, 4),
        chain_ranges(packed, prefix_rows),
    )


# ---------------------------------------------------------------------------------------------------------------
# The blob: one H2D copy per forward


def tile_capacity(token_bucket: int, readout_bucket: int, tokens_per_tile: int) -> int:
    """Upper bound on the tiles of a forward of at most `token_bucket` tokens in B <= 2·`readout_bucket` blocks: the
    attention grid, so it depends on the buckets only (a CUDA graph's key). Programs past a forward's tile count exit
    at once, but each still takes a launch slot with the kernel's shared memory, so the bound should be tight.

    Σ_b ceil(len_b/NT) <= Σ_b (floor(len_b/NT) + 1) <= floor(n/NT) + B <= ceil(T_b/NT) + min(T_b, 2·R_b), as
    B <= n <= T_b (every block has a token) and B <= 2·R_b (`layout_for` picks R_b >= ceil(B/2)). The packer
    (core/packing/tree.py) gives B <= 2·R − rows: every block ends a prompt or has two children or more, since distinct
    prompts branch where their common prefix ends and the depth limit splits a group into one leaf per prompt."""
    return -(-token_bucket // tokens_per_tile) + min(token_bucket, 2 * readout_bucket)


@dataclass(frozen=True)
class BlobLayout:
    """Offsets (in int32 elements) of each field in the blob of one (token bucket, readout bucket)."""

    token_bucket: int
    readout_bucket: int
    tile_cap: int

    @property
    def fields(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """name -> (offset, shape)."""
        t, r, q = self.token_bucket, self.readout_bucket, self.tile_cap
        shapes = {
            "counts": (COUNTS,),
            "tokens": (t,),
            "positions": (t,),
            "tiles": (q, 4),
            "readout_tiles": (r, 4),
            "readouts": (r,),
            "ranges": (t, RANGES, 3),  # blocks <= tokens
        }
        out, offset = {}, 0
        for name, shape in shapes.items():
            out[name] = (offset, shape)
            offset += int(np.prod(shape))
        return out

    @property
    def size(self) -> int:
        offset, shape = list(self.fields.values())[-1]
        return offset + int(np.prod(shape))

    def views(self, blob):
        """name -> view of `blob` (numpy array or torch tensor of `size` int32)."""
        return {n: blob[o : o + int(np.prod(s))].reshape(s) for n, (o, s) in self.fields.items()}


def pack_blob(
    packed: PackedForward, tiling: TileLayout, layout: BlobLayout, out: np.ndarray | None = None
) -> np.ndarray:
    """Write the forward's metadata into a blob (zeros past every count, so nothing stale survives)."""
    n, r = packed.n_tokens, len(packed.readouts)
    if n > layout.token_bucket or r > layout.readout_bucket or len(tiling.tiles) > layout.tile_cap:
        raise ValueError(
            f"forward of {n} tokens / {r} readouts / {len(tiling.tiles)} tiles does not fit bucket {layout}"
        )
    blob = np.zeros(layout.size, dtype=np.int32) if out is None else out
    blob[:] = 0
    v = layout.views(blob)
    v["counts"][:] = (len(tiling.tiles), len(tiling.readout_tiles), n, r)
    v["tokens"][:n] = packed.tokens
    v["positions"][:n] = packed.positions
    v["tiles"][: len(tiling.tiles)] = tiling.tiles
    v["readout_tiles"][:r] = tiling.readout_tiles
    v["readouts"][:r] = packed.readouts
    v["ranges"][: len(tiling.ranges)] = tiling.ranges
    return blob


def unpack_blob(blob: np.ndarray, layout: BlobLayout) -> dict[str, np.ndarray]:
    """The used part of every field (the inverse of `pack_blob`, for tests and debugging)."""
    v = layout.views(np.asarray(blob))
    n_tiles, n_readout_tiles, n, r = (int(x) for x in v["counts"])
    return {
        "tokens": v["tokens"][:n],
        "positions": v["positions"][:n],
        "tiles": v["tiles"][:n_tiles],
        "readout_tiles": v["readout_tiles"][:n_readout_tiles],
        "readouts": v["readouts"][:r],
        "ranges": v["ranges"],
    }
