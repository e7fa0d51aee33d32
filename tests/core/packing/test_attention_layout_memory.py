"""The attention plan of many questions on one state: the same key rows as a plain reading of the tree, kept as
key ranges, so that planning and the plans a forward keeps grow with packed tokens, not questions x state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from basal.backends.cuda import ops as K
from basal.core.packing.attention_layout import KEY_TILE, TILE_GROUP, lay_out_attention
from tests.core.many_questions import traced

CPU = torch.device("cpu")


def _tree(questions: int, state: int, suffix: int):
    """Block 0: a state of `state` tokens after a cached prefix of 5; then per question a block of `suffix`."""
    lens = [state] + [suffix] * questions
    starts = np.cumsum([0, *lens[:-1]])
    block_of = np.repeat(np.arange(len(lens)), lens)
    positions = np.concatenate([np.arange(5, 5 + state)] + [np.arange(5 + state, 5 + state + suffix)] * questions)
    parent = np.array([-1] + [0] * questions)
    prefix = np.array([0] + [-1] * questions)
    return block_of, positions, starts, np.array(lens), parent, prefix, {0: (1, 5)}, 6


def _reference(args, queries: np.ndarray, rows: int):
    """The keys of each query chunk read off the tree directly: ancestors' rows, then the block's own."""
    block_of, positions, starts, lens, parent, prefix, offsets, flat = args

    def keys(b: int) -> list[int]:
        if parent[b] >= 0:
            head = keys(int(parent[b]))
        elif prefix[b] >= 0:
            s, n = offsets[int(prefix[b])]
            head = list(range(s, s + n))
        else:
            head = []
        return head + list(range(int(starts[b]) + flat, int(starts[b] + lens[b]) + flat))

    chunks = []
    by_block: dict[int, list[int]] = {}
    for q in queries.tolist():
        by_block.setdefault(int(block_of[q]), []).append(q)
    for b, qs in by_block.items():
        k = keys(b)
        for i in range(0, len(qs), rows):
            part = qs[i : i + rows]
            chunks.append((part, k[: int(positions[part].max()) + 1]))
    chunks.sort(key=lambda c: len(c[1]))
    out = []
    for g in range(0, len(chunks), TILE_GROUP):
        part = chunks[g : g + TILE_GROUP]
        width = -(-max(len(c[1]) for c in part) // KEY_TILE) * KEY_TILE
        out.append([(c[0], c[1] + [0] * (width - len(c[1]))) for c in part])
    return out


def test_the_plan_reads_the_same_keys_as_the_tree():
    args = _tree(questions=40, state=300, suffix=7)
    n = len(args[0])
    for queries, rows in ((np.arange(n), 64), (np.arange(300, n, 7), 1)):
        plan = lay_out_attention(*args, queries, rows)
        want = _reference(args, queries, rows)
        assert len(plan.groups) == len(want)
        for (q_idx, q_pos, k_idx), chunks in zip(plan.explicit(), want, strict=True):
            for c, (qs, keys) in enumerate(chunks):
                assert q_idx[c, : len(qs)].tolist() == qs
                assert (q_pos[c, : len(qs)] == args[1][qs]).all() and (q_pos[c, len(qs) :] == -1).all()
                assert k_idx[c].tolist() == keys


PER_TOKEN = 512  # bytes of plan per packed token, whatever the state's length (an index list per block: ~4 KB)


@pytest.mark.parametrize("state", [2000, 4000])
def test_planning_memory_grows_with_packed_tokens(state):
    """512 questions on one state: planning both of a forward's plans (every token, then the readouts) peaks
    under a constant times the packed tokens, and so do the plans the torch backend keeps for every layer."""
    args = _tree(questions=512, state=state, suffix=4)
    n = len(args[0])
    readouts = np.arange(state + 3, n, 4)
    lay_out_attention(*args, np.arange(n), 64)  # warm up
    plans, _, peak = traced(lambda: (lay_out_attention(*args, np.arange(n), 64), lay_out_attention(*args, readouts, 1)))
    assert peak < PER_TOKEN * n, (peak, n)
    kept = sum(t.nbytes for p in plans for g in K.to_torch(p, CPU) for t in (g.q_idx, g.q_pos, g.k_row, g.k_end))
    assert kept < PER_TOKEN * n, (kept, n)


def test_torch_groups_read_the_plans_keys():
    """The torch regrouping expands its ranges to the plan's own key rows (cut to the tiles each chunk needs)."""
    args = _tree(questions=40, state=300, suffix=7)
    n = len(args[0])
    for queries, rows in ((np.arange(n), 64), (np.arange(306, n, 7), 1)):
        plan = lay_out_attention(*args, queries, rows)
        want = {}
        for q_idx, _, k_idx in plan.explicit():
            for c in range(len(q_idx)):
                want[int(q_idx[c, 0])] = k_idx[c].tolist()
        for g in K.to_torch(plan, CPU):
            for c, keys in enumerate(g.key_rows().tolist()):
                full = want[int(g.q_idx[c, 0])]
                assert keys == full[: g.n_keys] and not any(full[g.n_keys :]), int(g.q_idx[c, 0])
