"""Prefix-tree packing: the reference packer's example and golden fields, and structural properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.packing.tree import (
    MAX_DEPTH,
    TokenizedQuestion,
    TrieSize,
    pack_fields,
    pack_row,
    packed_tokens,
    split_forwards,
)
from tests.conftest import golden_records

LETTERS = list(range(100, 110))


def test_reference_packer_example():
    """docs/contract.md §3: [1,2,3,4,5] and [1,2,3,7,8,9]."""
    row = pack_row([(1, 2, 3, 4, 5), (1, 2, 3, 7, 8, 9)])
    assert row.tokens == [1, 2, 3, 4, 5, 7, 8, 9]
    assert row.positions == [0, 1, 2, 3, 4, 3, 4, 5]
    assert row.block_of == [0, 0, 0, 1, 1, 2, 2, 2]
    assert [row.ends[0], row.ends[1]] == [4, 7]


def _golden_orders():
    for rec in golden_records("bench-sample.jsonl"):
        yield rec["id"] or str(rec["index"]), [o["input_ids"] for o in rec["orders"]], rec["pack"]
    for rec in golden_records("systemone-sample.jsonl"):
        for it in rec["items"]:
            yield f"{rec['id']}/{it['name']}", [o["input_ids"] for o in it["orders"]], it["pack"]


@pytest.mark.parametrize(
    ("name", "orders", "pack"), list(_golden_orders()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_golden_pack_fields(name, orders, pack):
    assert pack_fields(orders) == pack


def test_identical_prompts_share_one_readout():
    qs = [
        TokenizedQuestion("en", "s", ((1, 2, 3, 4), (1, 2, 3, 5))),
        TokenizedQuestion("en", "s", ((1, 2, 3, 4), (1, 2, 3, 6))),
    ]
    (f,) = split_forwards(qs, LETTERS)
    assert f.readout_of[(0, 0)] == f.readout_of[(1, 0)]
    assert len(f.packed.readouts) == 3 and f.packed.n_tokens == 6


def _reconstruct(batch, readout: int) -> tuple[list[int], list[int]]:
    """Tokens and positions a readout's query can see: its ancestor chain up to and including itself."""
    token = int(batch.readouts[readout])
    block = int(batch.block_of[token])
    flat = []
    for b in batch.chain(block):
        end = batch.block_start[b] + batch.block_len[b] if b != block else token + 1
        flat += list(range(batch.block_start[b], end))
    return batch.tokens[flat].tolist(), batch.positions[flat].tolist()


prompt_sets = st.lists(
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=12), min_size=1, max_size=3).map(
        lambda orders: tuple(tuple([7, *o, 9]) for o in orders)
    ),  # every prompt starts with 7, ends with 9
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(prompt_sets, st.sampled_from([None, 1]))
def test_every_readout_sees_exactly_its_prompt(questions, cache):
    """The ancestor chain of every readout is its own prompt, at positions 0..n-1, whatever the tree."""
    qs = [TokenizedQuestion("en", str(i % 3), ps) for i, ps in enumerate(questions)]
    prefixes = {"en": (7,)} if cache else None
    for f in split_forwards(qs, LETTERS, prefixes, tree_max_tokens=40, forward_max_tokens=60):
        b = f.packed
        assert np.all(b.block_len > 0)
        assert all(len(b.chain(i)) <= MAX_DEPTH for i in range(len(b.block_len)))
        for (qi, order), r in f.readout_of.items():
            tokens, positions = _reconstruct(b, r)
            prompt = qs[qi].prompts[order][1 if cache else 0 :]
            assert tokens == list(prompt)
            assert positions == list(range(1 if cache else 0, len(qs[qi].prompts[order])))


def test_split_forwards_keeps_its_depth_limit():
    """`max_depth` reaches the trie: a ladder of questions `1^k 2` / `1^k 3` nests k deep without it."""
    ladder = [TokenizedQuestion("en", "s", ((7, *[1] * k, 2), (7, *[1] * k, 3))) for k in range(6)]
    for depth in (2, 3, MAX_DEPTH):
        (f,) = split_forwards(ladder, LETTERS, max_depth=depth)
        deepest = max(len(f.packed.chain(i)) for i in range(len(f.packed.block_len)))
        assert deepest == min(depth, 7), depth


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=8).map(tuple), min_size=1, max_size=20))
def test_trie_size_counts_shared_prefixes_once(prompts):
    distinct = list(dict.fromkeys(prompts))
    nodes = {p[:i] for p in distinct for i in range(1, len(p) + 1)}  # one trie node per distinct prefix
    size = TrieSize()
    for p in prompts:
        size.add(p)
    assert size.tokens == len(nodes) == packed_tokens(prompts)


def test_depth_limit_stops_sharing():
    # prompts that branch at every token would nest 12 deep; the trie stops sharing at depth 8
    prompts = [tuple([1] * i + [2, 3]) for i in range(12)]
    row = pack_row(prompts, max_depth=MAX_DEPTH)
    depth = {}
    for b, (_, _, parent) in enumerate(row.blocks):
        depth[b] = 0 if parent < 0 else depth[parent] + 1
    assert max(depth.values()) == MAX_DEPTH - 1


def test_rows_split_by_language_and_group_states():
    en = [TokenizedQuestion("en", s, ((1, 2, 3 + i), (1, 2, 9 + i))) for i, s in enumerate("abab")]
    pl = [TokenizedQuestion("pl", "c", ((5, 6, 7), (5, 6, 8)))]
    forwards = split_forwards([en[0], pl[0], *en[1:]], LETTERS, tree_max_tokens=9, forward_max_tokens=1000)
    (f,) = forwards
    roots = np.flatnonzero(f.packed.block_parent < 0)
    # every row holds one language; en questions on state "a" (0, 2) come before those on "b"
    row_tokens = [set(f.packed.tokens[s : s + 3].tolist()) for s in f.packed.block_start[roots]]
    assert len(roots) >= 3 and {5, 6} <= row_tokens[-1]
    order = sorted(f.readout_of, key=f.readout_of.get)
    assert [q for q, _ in order][:4] == [0, 0, 3, 3]  # input index 3 = en[2] (state "a") right after en[0]


def test_forward_and_row_limits():
    qs = [TokenizedQuestion("en", str(i), ((i, 1, 2, 3, 4), (i, 1, 2, 3, 5))) for i in range(20)]
    forwards = split_forwards(qs, LETTERS, tree_max_tokens=18, forward_max_tokens=30)
    assert len(forwards) > 1
    for f in forwards:
        assert f.packed.n_tokens <= 30
    assert sorted(k for f in forwards for k in f.readout_of) == [(i, o) for i in range(20) for o in (0, 1)]


def test_cached_prefix_must_match():
    with pytest.raises(ValueError, match="template prefix"):
        split_forwards([TokenizedQuestion("en", "s", ((1, 2, 3), (1, 2, 4)))], LETTERS, {"en": (9,)})


def test_tree_off_baseline_puts_each_question_in_its_own_row():
    qs = [TokenizedQuestion("en", "s", ((1, 2, 3, 4, 5 + i), (1, 2, 3, 4, 9 + i))) for i in range(3)]
    (shared,) = split_forwards(qs, LETTERS)
    (alone,) = split_forwards(qs, LETTERS, share_across_questions=False)
    assert int((alone.packed.block_parent < 0).sum()) == 3 and int((shared.packed.block_parent < 0).sum()) == 1
    assert alone.packed.n_tokens == 3 * 6 and shared.packed.n_tokens == 4 + 6
