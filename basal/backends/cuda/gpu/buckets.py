"""Token and readout buckets (docs/gpu-path.md §6): a forward is padded to a bucket, so CUDA graphs, grids and the GEMM
probe see a finite set of shapes. Padding changes only M, which every kernel is invariant to."""

from __future__ import annotations

import bisect

from basal.core.packing.tile_layout import BlobLayout, tile_capacity

# multiples of 16, each step <= 1.5x: padded GEMM work <= 50 %, ~15 % on average
TOKEN_BUCKETS = (32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 2048, 2560, 3072)
TOKEN_BUCKETS += (4096, 5120, 6144, 8192)
READOUT_BUCKETS = (4, 16, 64, 256, 1024)
LONG_STEP = 1024  # above the largest bucket (the long lane): multiples of this
LT_CHUNK = TOKEN_BUCKETS[-1]  # library GEMMs on the long lane run in row chunks of this size


def token_bucket(n: int) -> int:
    if n < 1:
        raise ValueError("a forward needs at least one token")
    if n > TOKEN_BUCKETS[-1]:
        return -(-n // LONG_STEP) * LONG_STEP
    return TOKEN_BUCKETS[bisect.bisect_left(TOKEN_BUCKETS, n)]


def readout_bucket(r: int) -> int:
    if r > READOUT_BUCKETS[-1]:
        return -(-r // READOUT_BUCKETS[-1]) * READOUT_BUCKETS[-1]
    return READOUT_BUCKETS[bisect.bisect_left(READOUT_BUCKETS, max(r, 1))]


def long_lane_chunks(rows: int) -> list[int]:
    """Row counts of a long-lane library GEMM: chunks of LT_CHUNK, then the remainder (a multiple of LONG_STEP)."""
    out = [LT_CHUNK] * (rows // LT_CHUNK)
    if rows % LT_CHUNK:
        out.append(rows % LT_CHUNK)
    return out


def probed_row_counts(max_rows: int = TOKEN_BUCKETS[-1]) -> list[int]:
    """Every M a GEMM of this process can see: token and readout buckets, and the long lane's chunk remainders."""
    remainders = range(LONG_STEP, LT_CHUNK, LONG_STEP)
    found = {m for m in (*TOKEN_BUCKETS, *READOUT_BUCKETS, *remainders) if m <= max_rows}
    return sorted(found)


WARM_TOKENS = 2048  # graphs captured at start: every token bucket up to this


def warm_buckets(max_tokens: int = WARM_TOKENS) -> list[tuple[int, int]]:
    """(token bucket, readout bucket) pairs to capture at start: every token bucket up to `max_tokens` with 4
    readouts (one or two questions), with 16 from 128 tokens and 64 from 512 (forwards of about 8 and 32
    questions: a question is two option orders of 60+ tokens each)."""
    return [(t, r) for t in TOKEN_BUCKETS if t <= max_tokens for r in (4, 16, 64) if t >= 8 * r]


def layout_for(tokens: int, readouts: int, blocks: int, tokens_per_tile: int) -> BlobLayout:
    """The metadata blob's layout of a forward of `tokens` tokens, `readouts` readouts and `blocks` blocks: its
    buckets' sizes. The readout bucket also covers half the blocks, since the tile capacity counts on 2 blocks per
    readout at most; a packed forward never needs more (core/packing/tree.py), a hand-built one gets a larger bucket."""
    t_b, r_b = token_bucket(tokens), readout_bucket(max(readouts, -(-blocks // 2)))
    return BlobLayout(t_b, r_b, tile_capacity(t_b, r_b, tokens_per_tile))
