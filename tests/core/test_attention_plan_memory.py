"""The attention plan of many questions on one state: the same key rows as a plain reading of the tree, built
without a copy of the state's keys per block (its memory is the plan's own arrays, plus a little)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from basal.core.packing.attention_plan import KEY_TILE, TILE_GROUP, plan_attention


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
        plan = plan_attention(*args, queries, rows)
        want = _reference(args, queries, rows)
        assert len(plan.groups) == len(want)
        for (q_idx, q_pos, k_idx), chunks in zip(plan.groups, want, strict=True):
            for c, (qs, keys) in enumerate(chunks):
                assert q_idx[c, : len(qs)].tolist() == qs
                assert (q_pos[c, : len(qs)] == args[1][qs]).all() and (q_pos[c, len(qs) :] == -1).all()
                assert k_idx[c].tolist() == keys


def test_planning_holds_no_copy_of_the_state_per_block():
    args = _tree(questions=512, state=2000, suffix=4)
    queries = np.arange(len(args[0]))
    plan_attention(*args, queries, 64)  # warm up
    tracemalloc.start()
    try:
        plan = plan_attention(*args, queries, 64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    own = sum(a.nbytes for g in plan.groups for a in g)
    assert peak < 1.25 * own + (2 << 20), (peak, own)
