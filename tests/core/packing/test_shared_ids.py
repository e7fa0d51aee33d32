"""The prompts on one state keep its ids once (`SharedIds`): they read exactly as the tuples they stand for, pack
into the same batches, and a tokenized request's memory grows with its packed tokens, not questions × state."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest

from basal.core.packing.tree import (
    PromptSharer,
    SharedIds,
    TokenizedQuestion,
    TrieSize,
    as_tuple,
    common_prefix,
    lcp,
    split_forwards,
)
from tests.core.many_questions import pipeline_and_items, traced


def naive_lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def random_prompts(rng: random.Random, states: int = 3, per_state: int = 40) -> list[tuple[str, tuple[int, ...]]]:
    """Prompts as a template, a state, then a question part: most share long prefixes, some diverge early."""
    template = tuple(rng.randrange(5) for _ in range(70))
    out = []
    for s in range(states):
        state = tuple(rng.randrange(6) for _ in range(rng.randrange(0, 200)))
        for _ in range(per_state):
            cut = rng.choice([len(template) + len(state), rng.randrange(0, len(template) + len(state) + 1)])
            head = (template + state)[:cut]
            tail = tuple(rng.randrange(6) for _ in range(rng.randrange(0, 12)))
            out.append((f"s{s}", head + tail))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_shared_ids_read_and_order_as_their_tuples(seed):
    rng = random.Random(seed)
    share = PromptSharer()
    plain = random_prompts(rng)
    stored = [share(state, ids) for state, ids in plain]
    tuples = [ids for _, ids in plain]
    assert any(isinstance(p, SharedIds) for p in stored)
    for p, t in zip(stored, tuples, strict=True):
        assert as_tuple(p) == t and tuple(p) == t and len(p) == len(t)
        assert p == t and t == p and hash(p) == hash(t)
        for i in (0, 1, len(t) // 2, len(t) - 1, -1, -len(t)):
            if -len(t) <= i < len(t):
                assert p[i] == t[i]
        for _ in range(5):
            a, b = sorted(rng.randrange(-5, len(t) + 5) for _ in range(2))
            assert p[a:b] == t[a:b]
        k = rng.randrange(0, len(t) + 1)
        assert as_tuple(p.after(k, {}) if isinstance(p, SharedIds) else p[k:]) == t[k:]
    order = sorted(range(len(stored)), key=lambda i: stored[i])
    assert [tuples[i] for i in order] == sorted(tuples)
    for _ in range(300):
        i, j = rng.randrange(len(stored)), rng.randrange(len(stored))
        assert lcp(stored[i], stored[j]) == naive_lcp(tuples[i], tuples[j])
        assert (stored[i] == stored[j]) == (tuples[i] == tuples[j])
        assert (stored[i] < stored[j]) == (tuples[i] < tuples[j])
        assert common_prefix(tuples[i], tuples[j], rng.randrange(0, 80)) == naive_lcp(tuples[i], tuples[j])


def test_shared_prompts_pack_into_the_same_batches():
    rng = random.Random(7)
    share = PromptSharer()
    plain = random_prompts(rng, states=4, per_state=30)
    pairs = list(zip(plain[::2], plain[1::2], strict=True))
    as_tuples = [TokenizedQuestion("en", s, (a, b)) for (s, a), (_, b) in pairs]
    shared = [TokenizedQuestion("en", s, (share(s, a), share(s, b))) for (s, a), (_, b) in pairs]
    size_a, size_b = TrieSize(), TrieSize()
    for t, u in zip(as_tuples, shared, strict=True):
        for p, q in zip(t.ids, u.ids, strict=True):
            assert size_a.add(p) == size_b.add(q)
    prefix = plain[0][1][:20]
    for prefixes in ({}, {"en": prefix}):
        if prefixes:  # every prompt starts with the cached template prefix
            as_tuples = [TokenizedQuestion("en", t.state, tuple(prefix + p for p in t.prompts)) for t in as_tuples]
            share = PromptSharer()
            shared = [TokenizedQuestion("en", t.state, tuple(share(t.state, p) for p in t.prompts)) for t in as_tuples]
        a = split_forwards(as_tuples, [1, 2], prefixes, tree_max_tokens=900, forward_max_tokens=1500)
        b = split_forwards(shared, [1, 2], prefixes, tree_max_tokens=900, forward_max_tokens=1500)
        assert len(a) == len(b) > 1
        for fa, fb in zip(a, b, strict=True):
            assert fa.readout_of == fb.readout_of
            for name in ("tokens", "positions", "block_of", "block_start", "block_len", "block_parent", "readouts"):
                np.testing.assert_array_equal(getattr(fa.packed, name), getattr(fb.packed, name))


def test_a_tokenized_request_grows_with_its_packed_tokens(demo_model, monkeypatch):
    """256 questions on a 6.5 KB state: the kept ids cost a few bytes per packed token (as tuples of their own,
    8 bytes per prompt token: ~50 times more here), and the ids are those the tokenizer gives each prompt."""
    pipeline, items = pipeline_and_items(demo_model, 256, monkeypatch)
    tokenized, held, peak = traced(lambda: pipeline.tokenize_items(items))
    prompts = [item.prompt(order, demo_model.bos) for item in items for order in item.orders]
    assert [p for t in tokenized for p in t.prompts] == demo_model.tokenizer.encode_batch(prompts)
    packed = pipeline.cost(tokenized)
    prompt_tokens = sum(n for t in tokenized for n in t.lengths)
    assert prompt_tokens > 40 * packed  # the state is repeated in every prompt
    assert held < 64 * packed, (held, packed, prompt_tokens)
    # while tokenizing: one encode batch (64 K characters) of ids and the tokenizer's structures at a time
    assert peak < 64 * packed + 4_000_000, (peak, packed)


def test_costing_and_planning_do_not_rebuild_every_prompt(demo_model, monkeypatch):
    """Costing and planning read the shared ids as they are: their peak grows with the packed tokens (the packed
    arrays being built), never with the prompts' tokens (rebuilding each prompt's tuple would be ~10 MB here)."""
    pipeline, items = pipeline_and_items(demo_model, 256, monkeypatch)
    tokenized = pipeline.tokenize_items(items)
    tracemalloc.start()
    try:
        packed = pipeline.cost(tokenized)
        cost_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        forwards = split_forwards(tokenized, [1, 2])
        plan_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(f.packed.n_tokens for f in forwards) >= packed
    prompt_bytes = 8 * sum(n for t in tokenized for n in t.lengths)
    assert prompt_bytes > 40 * 8 * packed
    assert cost_peak < 16 * packed, (cost_peak, packed)
    assert plan_peak < 200 * packed, (plan_peak, packed)
