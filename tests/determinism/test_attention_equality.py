"""The batched tree attention gives the same bits as the first version's tile loop (bench/tiled_attention.py):
op level on the prefix lengths and tree edges of test_ops, and model level on the invariance suite's cases for
every dtype, where alone = batch = tree must hold with either implementation."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from basal.backends.cuda import kernels as K
from basal.core.attention_plan import plan_attention
from bench.tiled_attention import tiled_tree_attention
from tests.determinism.harness import Harness, same_bits


def _tree_case(seed: int, block_len: list[int], parents: list[int], rows: int, queries=None):
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim = 4, 2, 16
    n = sum(block_len)
    starts = np.cumsum([0, *block_len[:-1]]).astype(np.int32)
    first_pos = []
    for p in parents:
        first_pos.append(0 if p < 0 else first_pos[p] + block_len[p])
    positions = np.concatenate([np.arange(f, f + m) for f, m in zip(first_pos, block_len, strict=True)])
    queries = np.arange(n) if queries is None else queries
    plan = plan_attention(
        np.repeat(np.arange(len(block_len)), block_len).astype(np.int32),
        positions.astype(np.int32),
        starts,
        np.asarray(block_len),
        np.asarray(parents),
        np.full(len(block_len), -1),
        {},
        1,
        queries,
        rows,
    )
    k = torch.randn(n + 1, kv_heads, dim, generator=g)
    v = torch.randn(n + 1, kv_heads, dim, generator=g)
    k[0] = v[0] = 0
    q = torch.randn(len(queries), heads, dim, generator=g)
    rows_of = torch.full((n,), -1, dtype=torch.int64)
    rows_of[torch.from_numpy(queries.astype(np.int64))] = torch.arange(len(queries))
    return q, k, v, K.to_torch(plan, torch.device("cpu")), rows_of


CASES = [
    ([1], [-1]),
    ([K.KEY_TILE - 1, 5, 9], [-1, 0, 0]),
    ([K.KEY_TILE, 1, K.KEY_TILE + 1], [-1, 0, 1]),
    ([2 * K.KEY_TILE + 5, 30, 40, 3], [-1, 0, 0, 2]),
    ([300, *[37] * 6], [-1, *[0] * 6]),  # several questions on one state
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("rows", [K.QUERY_ROWS, 1])
def test_batched_attention_equals_the_tile_loop(case, rows):
    block_len, parents = CASES[case]
    readouts = np.cumsum(block_len) - 1  # rows=1 is the last layer's plan: the readouts, one per chunk
    q, k, v, plan, rows_of = _tree_case(case, block_len, parents, rows, None if rows > 1 else readouts)
    new = K.tree_attention(q, k, v, plan, rows_of)
    old = tiled_tree_attention(q, k, v, plan, rows_of)
    assert new.view(torch.int32).equal(old.view(torch.int32))


def test_batched_attention_equals_the_tile_loop_across_spans(monkeypatch):
    """A span budget of one tile and of a few tiles: the split into spans changes no bit."""
    q, k, v, plan, rows_of = _tree_case(9, [3 * K.KEY_TILE + 3, 20], [-1, 0], K.QUERY_ROWS)
    old = tiled_tree_attention(q, k, v, plan, rows_of)
    for budget in (1, 1_700_000, 1 << 40):  # spans of 1, 3 (+1) and all 4 tiles (one tile ~0.53 MB here)
        monkeypatch.setattr(K, "ATTENTION_SPAN_BYTES", budget)
        assert K.tree_attention(q, k, v, plan, rows_of).view(torch.int32).equal(old.view(torch.int32)), budget


def _tiled_steps(q, key_buf, value_buf, plan, query_rows, fixed=True):
    return tiled_tree_attention(q, key_buf, value_buf, plan, query_rows, fixed)
    yield  # a generator with no pause points


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_model_logits_equal_with_either_attention(demo_model, dtype, monkeypatch):
    """The invariance suite's kind of batch (random questions, a shared state, block edges around tiles) gives the
    same logits bits with the tile loop and with the batched attention, in a tree and alone (test_invariance.py
    checks alone = batch = tree for the batched one on many more cases)."""
    h = Harness(demo_model, "torch", "cpu", dtype)
    rng = random.Random(5)
    qs = [h.question(rng, "pl", state_words=31, k=3)]
    qs += [h.question(rng, "pl", state=qs[0].state, k=k) for k in (2, 10)]
    qs += [h.question(rng, "en", state_words=w, k=2) for w in (15, 60)]
    new, new_alone = h.logits(qs), h.logits(qs[:1])
    monkeypatch.setattr(K, "tree_attention_steps", _tiled_steps)
    old, old_alone = h.logits(qs), h.logits(qs[:1])
    assert all(same_bits(a, b) for a, b in zip(new, old, strict=True))
    assert same_bits(new_alone[0], old_alone[0]) and same_bits(new[0], new_alone[0])
