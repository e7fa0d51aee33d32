"""The state cache keeps the bits: a question's letter logits are bitwise identical with the cache off, on a miss,
on a hit, on a partial hit (a state that extends a cached one), after an eviction, after a reload, and batched
with hits and misses of others — for every backend × dtype here. The negative control hands back entries computed
in another dtype or by the shape-dependent path and expects a difference: the checks can fail."""

from __future__ import annotations

import random
from dataclasses import replace

import msgspec
import numpy as np
import pytest

from basal.backends.load import load_backend_class
from basal.core.engine.pipeline import Pipeline
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.dialects import parse_basal
from tests.determinism.harness import WORDS, Harness, bits, same_bits
from tests.determinism.test_evidence_rows import _evidence_question

STATE_WORDS = 90  # past a 64-key tile: the cached state ends inside its second tile


def _state_pipeline(h: Harness, mb: float = 64.0, backend=None) -> Pipeline:
    pipeline = Pipeline(h.cached.model, backend or h.backend, state_cache_mb=mb)
    assert pipeline.state_cache is not None
    return pipeline


def _logits(pipeline: Pipeline, questions: list[TokenizedQuestion]):
    return run_to_end(pipeline.letter_logits(questions))


def _on_state(h: Harness, seed: int, n: int, state: str | None = None, lang: str = "pl"):
    rng = random.Random(seed)
    first = h.question(rng, lang, state=state, state_words=STATE_WORDS)
    return [first, *(h.question(rng, lang, state=first.state) for _ in range(n - 1))]


@pytest.mark.parametrize("seed", range(2))
def test_miss_hit_and_cache_off_give_the_same_bits(harness, seed):
    questions = _on_state(harness, seed, 4)
    off = [harness.logits([q])[0] for q in questions]  # the template prefix only, each alone
    pipeline = _state_pipeline(harness)
    cache = pipeline.state_cache
    miss = _logits(pipeline, questions[:1])[0]
    assert cache.counts.misses == 1 and cache.entries == 1
    hits = [_logits(pipeline, [q])[0] for q in questions[1:]]
    assert cache.counts.hits == 3 and cache.counts.misses == 1
    assert same_bits(miss, off[0])
    assert all(same_bits(a, b) for a, b in zip(hits, off[1:], strict=True))
    # the hit really read the cache: its forward computed far fewer tokens than the prompt holds
    (forward,) = pipeline.pack_questions(pipeline_questions := questions[1:2])
    assert forward.packed.n_tokens < 0.5 * len(pipeline_questions[0].prompts[0])


def test_hits_and_misses_batched_with_others(harness):
    cached = _on_state(harness, 11, 2)
    pipeline = _state_pipeline(harness)
    _logits(pipeline, cached[:1])  # the state is now cached
    others = [*_on_state(harness, 12, 2, lang="en"), harness.question(random.Random(13), "pl")]
    batch = [others[0], cached[1], others[1], others[2]]
    together = _logits(pipeline, batch)
    assert all(same_bits(a, harness.logits([q])[0]) for a, q in zip(together, batch, strict=True))


def test_partial_hit_extends_a_cached_state(harness):
    (short,) = _on_state(harness, 21, 1)
    longer = _on_state(harness, 22, 1, state=short.state + " zwrot faktura termin płatność klient paczka")[0]
    pipeline = _state_pipeline(harness)
    _logits(pipeline, [short])
    got = _logits(pipeline, [longer])[0]
    assert pipeline.state_cache.counts.partial_hits == 1
    assert same_bits(got, harness.logits([longer])[0])
    third = _on_state(harness, 23, 1, state=longer.state)[0]
    again = _logits(pipeline, [third])  # the extended entry, filled by the partial hit's forward, is a hit
    assert pipeline.state_cache.counts.hits == 1 and same_bits(again[0], harness.logits([third])[0])


def _kv_bits(backend, key: str) -> list[tuple[bytes, bytes]]:
    return [(np.asarray(k).tobytes(), np.asarray(v).tobytes()) for k, v in backend.net.prefix_kv[key]]


def _filled_and_alone(h: Harness, shift: int = 0) -> tuple[list, list]:
    """The K/V of a state's entry as a forward of several questions on several states filled it, and as a forward
    of the state alone computes it (`Backend.prefix`). `shift`: the forward keeps the rows that many tokens on
    (the negative control)."""
    questions = [*_on_state(h, 51, 2), *_on_state(h, 52, 1), h.question(random.Random(53), "pl")]
    backend = h.backend
    pipeline = _state_pipeline(h)
    forwards = pipeline.pack_questions(questions)
    if shift:
        moved = [tuple((k, b, rows + shift) for k, b, rows in f.packed.fills) for f in forwards]
        forwards = [replace(f, packed=replace(f.packed, fills=m)) for f, m in zip(forwards, moved, strict=True)]
    entry = pipeline.state_cache._entries[("", "pl", pipeline.state_cache.state_ids(questions[0]))]
    assert any(key == entry.key for f in forwards for key, _, _ in f.packed.fills)
    run_to_end(pipeline.run_forwards(questions, forwards))
    assert entry.ready and pipeline.state_cache.counts.computed_tokens > 0
    template = pipeline.prefixes["pl"]
    backend.prefix("alone", entry.ids[len(template) :], "pl")
    return _kv_bits(backend, entry.key), _kv_bits(backend, "alone")


def test_an_entry_filled_in_a_forward_is_the_state_computed_alone(harness):
    filled, alone = _filled_and_alone(harness)
    assert len(filled) == harness.cached.model.config.num_hidden_layers and filled == alone


def test_negative_control_a_fill_from_the_wrong_rows_is_caught(demo_model):
    filled, alone = _filled_and_alone(Harness(demo_model, "torch", "cpu", "f32"), shift=1)
    assert filled != alone


def test_after_eviction_and_after_a_reload(harness):
    a, b = _on_state(harness, 31, 2)[0], _on_state(harness, 32, 1)[0]
    reference = harness.logits([a])[0]
    pipeline = _state_pipeline(harness)
    _logits(pipeline, [a])
    one_entry = pipeline.state_cache.bytes
    small = _state_pipeline(harness, mb=one_entry * 1.5 / (1 << 20))  # room for one entry
    _logits(small, [a])
    _logits(small, [b])  # evicts a
    assert small.state_cache.counts.evictions == 1 and small.state_cache.entries == 1
    assert small.state_cache.bytes <= small.state_cache.budget
    assert same_bits(_logits(small, [a])[0], reference)  # computed again: a miss after an eviction
    assert small.state_cache.counts.misses == 3
    backend = harness.backend
    reloaded = load_backend_class(backend.name).load(harness.cached.model, dtype=backend.dtype, device=backend.device)
    fresh = _state_pipeline(harness, backend=reloaded)
    _logits(fresh, [a])
    assert same_bits(_logits(fresh, [a])[0], reference) and fresh.state_cache.counts.hits == 1


class _WrongEntries:
    """A backend whose state entries come from another backend (another dtype, or the shape-dependent path): what
    a cache that mixed up its entries would hand back, whether an entry is computed alone or filled in a forward."""

    def __init__(self, inner, source):
        self.inner, self.source = inner, source

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefix(self, key, tokens, base=None):
        nbytes = self.inner.prefix(key, tokens, base)  # the right entry first (same length, same bytes)
        if key not in ("pl", "en"):  # a state: its K/V swapped for the other backend's
            self._swap(key, tokens, base)
        return nbytes

    def run(self, packed, prepared=None, preemptible=False):
        logits = yield from self.inner.run(packed, prepared, preemptible)
        for key, base, rows in packed.fills:
            self._swap(key, packed.tokens[rows].tolist(), base)
        return logits

    def _swap(self, key, tokens, base):
        self.source.prefix(key, tokens, base)
        self.inner.net.prefix_kv[key] = [(k.float(), v.float()) for k, v in self.source.net.prefix_kv[key]]


@pytest.mark.parametrize("source", ["bf16", "shape-dependent"])
def test_negative_control_wrong_entries_are_caught(demo_model, source):
    torch_backend = load_backend_class("torch")
    h = Harness(demo_model, "torch", "cpu", "f32")
    other = (
        torch_backend.load(demo_model, dtype="bf16", device="cpu")
        if source == "bf16"
        else torch_backend.load(demo_model, dtype="f32", device="cpu", fixed_shapes=False)
    )
    Pipeline(demo_model, other)  # its template prefixes
    questions = _on_state(h, 41, 3)
    wrong = _state_pipeline(h, backend=_WrongEntries(h.backend, other))
    got = [_logits(wrong, [q])[0] for q in questions]
    assert not all(same_bits(a, h.logits([q])[0]) for a, q in zip(got, questions, strict=True))


# -- evidence questions: the hidden states of their state tokens kept with the entry -----------------------------


def _evidence_on(h: Harness, seed: int, n: int, state: str | None = None) -> list[TokenizedQuestion]:
    rng = random.Random(seed)
    state = state or " ".join(rng.choice(WORDS["pl"]) for _ in range(STATE_WORDS))
    return [_evidence_question(h.cached, rng, "pl", state=state) for _ in range(n)]


def _same_result(a, b) -> bool:
    """Letter logits of every order and the evidence rows (the state tokens', then the readout's), as bit patterns."""
    return same_bits(list(a), list(b)) and bits(np.asarray(a.states)) == bits(np.asarray(b.states))


def _entry(pipeline: Pipeline, question: TokenizedQuestion):
    cache = pipeline.state_cache
    return cache._entries[(question.cache_scope, question.lang, cache.state_ids(question))]


def test_evidence_miss_hit_upgrade_and_refill_give_the_same_bits(harness):
    ev = _evidence_on(harness, 61, 3)
    (other,) = _evidence_on(harness, 62, 1)
    off = [harness.logits([q])[0] for q in (*ev, other)]  # the template prefix only, each alone
    assert all(r.states is not None for r in off)
    pipeline = _state_pipeline(harness)
    cache = pipeline.state_cache
    miss = _logits(pipeline, ev[:1])[0]  # fills the entry: its K/V and its state rows' hidden states
    entry = _entry(pipeline, ev[0])
    template = len(pipeline.prefixes["pl"])
    assert cache.counts.misses == 1 and entry.ready and entry.hidden.shape[0] == len(entry.ids) - template
    assert (
        entry.hidden.dtype == np.float32
        and entry.nbytes == harness.backend.prefix_bytes(entry.key) + entry.hidden.nbytes
    )
    assert cache.bytes == entry.nbytes  # the hidden states counted in the budget
    hit = _logits(pipeline, ev[1:2])[0]
    assert cache.counts.hits == 1 and cache.counts.misses == 1
    (forward,) = pipeline.pack_questions(ev[2:3])  # a hit computes its question only: no state rows at all
    assert forward.packed.positions.min() == len(entry.ids) and len(forward.packed.hidden) == 0
    assert _same_result(miss, off[0]) and _same_result(hit, off[1])

    upgraded = _state_pipeline(harness)  # an entry filled by a plain question, without hidden states
    _logits(upgraded, [replace(ev[0], hidden=())])
    assert _entry(upgraded, ev[0]).hidden is None
    computed = _logits(upgraded, ev[:1])[0]  # computes its state and keeps its rows' hidden states
    assert upgraded.state_cache.counts.misses == 2 and _entry(upgraded, ev[0]).hidden is not None
    after = _logits(upgraded, ev[1:2])[0]
    assert upgraded.state_cache.counts.hits == 1
    assert _same_result(computed, off[0]) and _same_result(after, off[1])

    small = _state_pipeline(harness, mb=entry.nbytes * 1.5 / (1 << 20))  # room for one entry
    first = _logits(small, ev[:1])[0]
    stranger = _logits(small, [other])[0]  # evicts the first state
    assert small.state_cache.counts.evictions == 1 and small.state_cache.bytes <= small.state_cache.budget
    refilled = _logits(small, ev[1:2])[0]  # a miss again: fills anew
    again = _logits(small, ev[2:3])[0]
    assert small.state_cache.counts.misses == 3 and small.state_cache.counts.hits == 1
    assert all(
        _same_result(a, b) for a, b in ((first, off[0]), (stranger, off[3]), (refilled, off[1]), (again, off[2]))
    )


def test_evidence_batched_and_partial_hits_give_the_same_bits(harness):
    (short,) = _evidence_on(harness, 71, 1)
    (longer,) = _evidence_on(harness, 72, 1, state=short.state + " zwrot faktura termin płatność klient paczka")
    third, fourth = _evidence_on(harness, 73, 2, state=longer.state)
    plain = harness.question(random.Random(74), "pl", state=longer.state)
    pipeline = _state_pipeline(harness)
    _logits(pipeline, [short])
    got = _logits(pipeline, [longer])[0]  # reads the short state's K/V and hidden states, computes the rest
    assert pipeline.state_cache.counts.partial_hits == 1 and _entry(pipeline, longer).hidden is not None
    assert _same_result(got, harness.logits([longer])[0])
    # a hit, a plain question on the same state and a miss on another state, in one batch
    (stranger,) = _evidence_on(harness, 75, 1)
    together = _logits(pipeline, [third, plain, stranger, fourth])
    assert pipeline.state_cache.counts.hits == 1  # the state of third, fourth and plain, counted once
    alone = [harness.logits([q])[0] for q in (third, plain, stranger, fourth)]
    assert _same_result(together[0], alone[0]) and _same_result(together[3], alone[3])
    assert same_bits(list(together[1]), list(alone[1])) and _same_result(together[2], alone[2])


def _answer(pipeline: Pipeline, state: str, question: str) -> bytes:
    """A request's whole answer as served, less the fields that say how it was computed (latency, cached tokens)."""
    request = parse_basal(
        {"state": state, "questions": {"q": {"type": "noul", "instructions": question, "evidence": True}}},
        lambda _m: "m",
        serves_evidence=lambda _m: True,
    )
    response = pipeline.decide(request)
    response.usage.latency_ms, response.usage.cached_tokens = 0.0, msgspec.UNSET
    return msgspec.json.encode(response)


def test_evidence_answers_are_byte_identical_with_the_cache_on_and_off(harness):
    rng = random.Random(81)
    state, other = (" ".join(rng.choice(WORDS["pl"]) for _ in range(STATE_WORDS)) for _ in range(2))
    asked = ["Czy zwrot?", "Czy szybko?", "Czy faktura?"]
    off = [_answer(harness.cached, state, q) for q in asked]
    assert b'"evidence":[{' in off[0]
    pipeline = _state_pipeline(harness)
    assert [_answer(pipeline, state, q) for q in asked] == off  # a miss that fills, then hits
    assert pipeline.state_cache.counts.hits == 2
    longer = state + " zwrot faktura termin"  # a partial hit: the cached part's rows from the entry
    assert _answer(pipeline, longer, asked[0]) == _answer(harness.cached, longer, asked[0])
    assert pipeline.state_cache.counts.partial_hits == 1
    plain = Pipeline(harness.cached.model, harness.backend, state_cache_mb=64)  # entry first filled without rows
    run_to_end(plain.letter_logits([harness.question(rng, "pl", state=state)]))
    assert [_answer(plain, state, q) for q in asked] == off and plain.state_cache.counts.hits == 2
    entry = next(e for e in pipeline.state_cache._entries.values() if e.ready)
    small = _state_pipeline(harness, mb=entry.nbytes * 1.5 / (1 << 20))
    _answer(small, state, asked[0]), _answer(small, other, asked[0])  # the second evicts the first
    assert [_answer(small, state, q) for q in asked[1:]] == off[1:] and small.state_cache.counts.evictions >= 1


@pytest.mark.parametrize("wrong", ["shifted", "bf16"])
def test_negative_control_wrong_hidden_states_are_caught(demo_model, wrong):
    """An entry whose hidden states are one token off, or were computed in bf16: its hits must differ from off."""
    h = Harness(demo_model, "torch", "cpu", "f32")
    ev = _evidence_on(h, 91, 2)
    off = h.logits(ev[1:2])[0]
    pipeline = _state_pipeline(h)
    _logits(pipeline, ev[:1])
    entry = _entry(pipeline, ev[0])
    if wrong == "shifted":
        entry.hidden = np.ascontiguousarray(np.roll(entry.hidden, 1, axis=0))
    else:
        other = Harness(demo_model, "torch", "cpu", "bf16")
        bf16 = _state_pipeline(other)
        _logits(bf16, ev[:1])
        entry.hidden = _entry(bf16, ev[0]).hidden
    hit = _logits(pipeline, ev[1:2])[0]
    assert pipeline.state_cache.counts.hits == 1
    assert same_bits(list(hit), list(off))  # the K/V are right: only the hidden states are wrong
    assert not _same_result(hit, off)
    assert _answer(pipeline, ev[1].state, "Czy zwrot?") != _answer(h.cached, ev[1].state, "Czy zwrot?")


def test_evidence_rows_past_the_entry_come_from_the_hit_forward(harness):
    """Evidence rows that run past the entry (as a state's last token merged with the question's text would): a
    hit takes the entry's rows, then its forward's, in token order, with the bits of the cache off."""
    ev = _evidence_on(harness, 101, 2)
    pipeline = _state_pipeline(harness)
    n = len(pipeline.state_cache.state_ids(ev[0]))
    _logits(pipeline, ev[:1])
    past = replace(ev[1], hidden=range(ev[1].hidden[0], n + 3))
    hit = _logits(pipeline, [past])[0]
    assert pipeline.state_cache.counts.hits == 1
    assert _same_result(hit, harness.logits([past])[0])
    assert np.asarray(hit.states).shape[0] == n + 3 - ev[1].hidden[0] + 1
    (forward,) = pipeline.pack_questions([past])
    assert len(forward.packed.hidden) == 3 and forward.packed.positions.min() == n  # only those past the entry
