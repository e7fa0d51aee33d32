"""The current tree attention gives the same bits as main's batched tile-span attention before issue 16's second
round (bench/lab/baselines/main_path.py) and as the first version's tile loop
(bench/lab/baselines/tiled_attention.py): op level on the prefix
lengths and tree edges of test_ops, and model level on the invariance suite's cases for every dtype, where
alone = batch = tree must hold with each implementation. The negative control: the same comparison sees a
library exp."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from basal.backends.cuda import ops as K
from basal.core.packing.attention_layout import lay_out_attention
from basal.core.packing.passes import run_to_end
from bench.lab.baselines import main_path
from bench.lab.baselines.tiled_attention import tiled_tree_attention
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
    layout = lay_out_attention(
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
    return q, k, v, layout, rows_of


CASES = [
    ([1], [-1]),
    ([K.KEY_TILE - 1, 5, 9], [-1, 0, 0]),
    ([K.KEY_TILE, 1, K.KEY_TILE + 1], [-1, 0, 1]),
    ([2 * K.KEY_TILE + 5, 30, 40, 3], [-1, 0, 0, 2]),
    ([300, *[37] * 6], [-1, *[0] * 6]),  # several questions on one state
]


CPU = torch.device("cpu")


def _three_ways(q, k, v, layout, rows_of, fixed=True):
    """(current, main's batched, first tile loop) on one numpy layout."""
    new = K.tree_attention(q, k, v, K.to_torch(layout, CPU), rows_of, fixed)
    old_plan = main_path.to_torch(layout, CPU)
    main = run_to_end(main_path.tree_attention_steps(q, k, v, old_plan, rows_of, fixed))
    return new, main, tiled_tree_attention(q, k, v, old_plan, rows_of, fixed)


def _int(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("rows", [K.QUERY_ROWS, 1])
def test_attention_equals_main_and_the_tile_loop(case, rows):
    block_len, parents = CASES[case]
    readouts = np.cumsum(block_len) - 1  # rows=1 is the last layer's layout: the readouts, one per chunk
    q, k, v, layout, rows_of = _tree_case(case, block_len, parents, rows, None if rows > 1 else readouts)
    new, main, tiled = _three_ways(q, k, v, layout, rows_of)
    assert _int(new).equal(_int(main)) and _int(main).equal(_int(tiled))


def test_attention_regroups_by_needed_tiles_and_used_rows():
    """The many-questions case: chunks of one group in the layout need different numbers of key tiles and hold
    different numbers of queries; the regrouped layout keeps only what is needed, and every query once."""
    block_len, parents = CASES[-1]
    _, _, _, layout, _ = _tree_case(0, block_len, parents, K.QUERY_ROWS)
    groups = K.to_torch(layout, CPU)
    assert len(layout.groups) == 1 < len(groups)
    for g in groups:
        last = g.q_pos.max(dim=1).values
        assert g.n_keys == g.key_rows().shape[1] == -(-(int(last.max()) + 1) // K.KEY_TILE) * K.KEY_TILE
        assert torch.all(-(-(last + 1) // K.KEY_TILE) == g.n_keys // K.KEY_TILE)
        assert g.rows_used == int((g.q_pos >= 0).sum(dim=1).max()) and torch.all(g.q_pos[:, g.rows_used :] < 0)
    queries = torch.cat([g.q_idx[g.q_pos >= 0] for g in groups]).sort().values
    assert queries.equal(torch.arange(sum(block_len)))


def test_library_exp_is_seen():
    """Negative control: the comparison catches an attention whose exp is torch's (not bitwise det_exp)."""
    block_len, parents = CASES[3]
    q, k, v, layout, rows_of = _tree_case(4, block_len, parents, K.QUERY_ROWS)
    library = K.tree_attention(q, k, v, K.to_torch(layout, CPU), rows_of, fixed=False)
    main = run_to_end(main_path.tree_attention_steps(q, k, v, main_path.to_torch(layout, CPU), rows_of))
    assert not _int(library).equal(_int(main))


def test_attention_equals_main_across_spans(monkeypatch):
    """A span budget of one tile and of a few tiles: the split into spans changes no bit."""
    q, k, v, layout, rows_of = _tree_case(9, [3 * K.KEY_TILE + 3, 20], [-1, 0], K.QUERY_ROWS)
    _, main, _ = _three_ways(q, k, v, layout, rows_of)
    for budget in (1, 1_700_000, 1 << 40):  # spans of 1, a few and all 4 tiles
        monkeypatch.setattr(K, "ATTENTION_SPAN_BYTES", budget)
        new = K.tree_attention(q, k, v, K.to_torch(layout, CPU), rows_of)
        assert _int(new).equal(_int(main)), budget


def test_attention_equals_main_across_exp_blocks(monkeypatch):
    """det_exp's block size (an odd size, the default, the whole tensor) changes no bit."""
    q, k, v, layout, rows_of = _tree_case(3, [2 * K.KEY_TILE + 5, 30, 40, 3], [-1, 0, 0, 2], K.QUERY_ROWS)
    _, main, _ = _three_ways(q, k, v, layout, rows_of)
    for block in (777, K.EXP_BLOCK, 1 << 40):
        monkeypatch.setattr(K, "EXP_BLOCK", block)
        assert _int(K.tree_attention(q, k, v, K.to_torch(layout, CPU), rows_of)).equal(_int(main)), block


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_model_logits_equal_with_main_kernels(demo_model, dtype):
    """The invariance suite's kind of batch (random questions, a shared state, block edges around tiles) gives the
    same logits bits with main's kernels (batched tile-span attention, whole-tensor det_exp, GEMM chunks joined by
    cat) and with the current ones, in a tree and alone (test_invariance.py checks alone = batch = tree for the
    current ones on many more cases)."""
    h = Harness(demo_model, "torch", "cpu", dtype)
    rng = random.Random(5)
    qs = [h.question(rng, "pl", state_words=31, k=3)]
    qs += [h.question(rng, "pl", state=qs[0].state, k=k) for k in (2, 10)]
    qs += [h.question(rng, "en", state_words=w, k=2) for w in (15, 60)]
    new, new_alone = h.logits(qs), h.logits(qs[:1])
    with main_path.installed():
        old, old_alone = h.logits(qs), h.logits(qs[:1])
    assert all(same_bits(a, b) for a, b in zip(new, old, strict=True))
    assert same_bits(new_alone[0], old_alone[0]) and same_bits(new[0], new_alone[0])


def _strided_tile_gemms_change_bits() -> bool:
    """Whether this machine's BLAS gives main's tile GEMMs (scores [G*R, D] x [D, 64], then P x V) other bits for one
    chunk, whose permuted key and value views are valid strided batches it reads in place, than for the same chunk
    among two, which it copies first: the mechanism behind main's alone != batched. It does on some CPUs (found on an
    AMD EPYC); MKL on others (an Intel Xeon, 2026-12-02) gives the same bits either way."""
    g = torch.Generator().manual_seed(0)
    qs, p = torch.randn(2, 2, 1, 2, 16, generator=g), torch.randn(2, 2, 1, 2, 64, generator=g)
    k, v = torch.randn(2, 1, 64, 2, 16, generator=g), torch.randn(2, 1, 64, 2, 16, generator=g)
    scores, values = (0, 3, 1, 4, 2), (0, 3, 1, 2, 4)  # main_path's permutes
    one = torch.matmul(qs[:1], k[:1].permute(scores)), torch.matmul(p[:1], v[:1].permute(values))
    two = torch.matmul(qs, k.permute(scores)), torch.matmul(p, v.permute(values))
    return not all(torch.equal(a[0], b[0]) for a, b in zip(one, two, strict=True))


def test_a_readout_within_one_tile_alone_equals_batched():
    """A readout whose prompt fits one key tile, alone (a group of one chunk and one tile) and beside another
    prompt: main's kernel ran the first as a transposed GEMM (the permuted key view was a valid strided batch) and
    got other bits where the BLAS reads strided batches otherwise; the current one copies the keys to one layout in
    every group. Control: on such a machine main differs (elsewhere main has nothing to show)."""
    q, k, v, layout, rows_of = _tree_case(3, [40], [-1], 1, np.array([39]))
    q2, k2, v2, plan2, rows2 = _tree_case(3, [40, 30], [-1, -1], 1, np.array([39, 69]))
    q2[:1], k2[:41], v2[:41] = q, k, v
    alone, main_alone, _ = _three_ways(q, k, v, layout, rows_of)
    batched, main_batched, _ = _three_ways(q2, k2, v2, plan2, rows2)
    assert _int(alone[0]).equal(_int(batched[0])) and _int(batched).equal(_int(main_batched))
    main_differs = not _int(main_alone[0]).equal(_int(main_batched[0]))
    assert main_differs or not _strided_tile_gemms_change_bits()
