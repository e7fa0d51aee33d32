"""The FLOP counter of the benchmarks' achieved fraction, against counts worked out by hand on a tiny model."""

from __future__ import annotations

import numpy as np

from basal.benchsuite.flops import forward_flops, per_token_gemm_flops
from basal.core.model.model_dir import LlamaConfig
from basal.core.packing.tree import PackedForward

# hidden 8, intermediate 12, 2 layers, 2 heads of 4 (q width 8), 1 KV head (k, v width 4 each)
CFG = LlamaConfig(8, 12, 2, 2, 1, 4, 100, 1e-5, 1e4, 64, False)


def _batch(positions, block_of, starts, lens, parents, readouts, letters=3) -> PackedForward:
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    n = len(positions)
    return PackedForward(
        i32(range(n)), i32(positions), i32(block_of), i32(starts), i32(lens), i32(parents), i32([-1] * len(lens)),
        (), i32(readouts), i32(range(letters)),
    )  # fmt: skip


def test_per_token_gemm_flops_by_hand():
    # qkv: 2 * (8 + 4 + 4) * 8 = 256; o: 2 * 8 * 8 = 128; gate_up: 2 * 24 * 8 = 384; down: 2 * 8 * 12 = 192
    assert per_token_gemm_flops(CFG) == {"qkv": 256, "o": 128, "gate_up": 384, "down": 192}


def test_one_prompt_by_hand():
    """5 tokens at positions 0..4, read out at the last one, 3 letters."""
    f = forward_flops(CFG, _batch([0, 1, 2, 3, 4], [0] * 5, [0], [5], [-1], [4]))
    # layer 1: 5 tokens * 960 = 4800; layer 2: K/V of 5 tokens 5 * (2 * 8 * 8) = 640, the rest at 1 readout
    # 960 - 128 = 832; head: 2 * 8 * 3 = 48  ->  6320
    assert f.gemm == 6320
    # 4 * 8 = 32 per (query, key); layer 1: 1 + 2 + 3 + 4 + 5 = 15 pairs; layer 2: the readout's 5 -> 20 * 32
    assert f.attention == 640
    assert f.total == 6960


def test_two_prompts_sharing_a_root_by_hand():
    """root [0 1 2] -> children [3 4] and [3]: 6 packed tokens, readouts at flat 4 and 5."""
    f = forward_flops(CFG, _batch([0, 1, 2, 3, 4, 3], [0, 0, 0, 1, 1, 2], [0, 3, 5], [3, 2, 1], [-1, 0, 0], [4, 5]))
    # 6 * 960 + 6 * 128 + 2 * 832 + 2 * 48 = 5760 + 768 + 1664 + 96
    assert f.gemm == 8288
    # layer 1: 1 + 2 + 3 + 4 + 5 + 4 = 19 pairs; layer 2: 5 + 4 = 9 -> 28 * 32
    assert f.attention == 896
