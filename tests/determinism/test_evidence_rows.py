"""Evidence questions: their letter logits and the hidden states of their state tokens (what the pointer head reads)
are bitwise the same alone, in a batch, in a tree with other questions on the same state and with or without the
template-prefix cache — and asking for evidence does not change a question's logits. For every backend × dtype.

The negative control runs the same comparison of hidden states on a backend with shape-dependent kernels and
asserts it sees a difference: the check can fail.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from basal.core.engine.pipeline import Pipeline
from basal.core.model.prompt import Item
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion
from tests.determinism.harness import WORDS, Harness, available, bits, same_bits


def _evidence_question(
    pipeline: Pipeline, rng: random.Random, lang: str, state: str | None = None, words: int = 20
) -> TokenizedQuestion:
    """A choice about `state` that asks for the hidden states of its state tokens, as the pipeline plans one."""
    vocab = WORDS[lang]
    state = state or " ".join(rng.choice(vocab) for _ in range(words))
    k = rng.randint(2, 5)
    options = tuple(" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 3))) for _ in range(k))
    question = " ".join(rng.choice(vocab) for _ in range(4)) + "?"
    item = Item("q", "choice", tuple(f"k{i}" for i in range(k)), options, lang, state, question)
    found = {id(item): None}
    (tokenized,) = pipeline.tokenize_items([item], found)
    assert found[id(item)] is not None and tokenized.hidden, "the state has tokens"
    return tokenized


def _run(h: Harness, questions, cache: bool = True):
    return run_to_end((h.cached if cache else h.uncached).letter_logits(questions))


def _same_result(a, b) -> bool:
    """Logits of every order and the hidden-state rows, as bit patterns."""
    return same_bits(list(a), list(b)) and bits(np.asarray(a.states)) == bits(np.asarray(b.states))


@pytest.mark.parametrize("words", [2, 14])  # few last-layer rows (where plain GEMMs vary, see the control), more
def test_evidence_rows_alone_batched_and_in_a_tree(harness, words):
    rng = random.Random(words)
    anchor = _evidence_question(harness.cached, rng, "pl", words=words)
    alone = _run(harness, [anchor])[0]
    assert np.asarray(alone.states).shape == (len(anchor.hidden) + 1, harness.backend.model.config.hidden_size)
    sibling = _evidence_question(harness.cached, rng, "pl", state=anchor.state)  # shares the state's rows
    plain_sibling = harness.question(rng, "pl", state=anchor.state)
    strangers = [harness.question(rng, lang, state_words=12) for lang in ("en", "pl")]
    for batch, at in (
        ([strangers[0], anchor, strangers[1]], 1),  # a batch
        ([sibling, plain_sibling, anchor], 2),  # a tree: the state computed once for all three
    ):
        assert _same_result(_run(harness, batch)[at], alone), at
    assert _same_result(_run(harness, [anchor], cache=False)[0], alone)  # without the template-prefix cache


def test_asking_for_evidence_keeps_the_logits(harness):
    """The extra last-layer rows change nothing of the question's own readouts, alone or batched."""
    rng = random.Random(4)
    question = _evidence_question(harness.cached, rng, "en", words=10)
    without = replace(question, hidden=())
    others = [harness.question(rng, "en", state_words=10) for _ in range(2)]
    assert same_bits(list(_run(harness, [question])[0]), list(_run(harness, [without])[0]))
    with_rows, without_rows = _run(harness, [*others, question]), _run(harness, [*others, without])
    assert all(same_bits(list(a), list(b)) for a, b in zip(with_rows, without_rows, strict=True))
    assert with_rows[-1].states is not None and without_rows[-1].states is None


@pytest.mark.parametrize(
    "combo", [c for c in available() if c[0] == "torch" and c[2] == "f32"][:1], ids=lambda c: "-".join(c)
)
def test_negative_control_sees_a_difference_in_the_evidence_rows(demo_model, combo):
    """Shape-dependent kernels must change the hidden states between alone and batched; else the check is void.
    A short state keeps the last layer's rows alone few (plain GEMMs change their arithmetic with the row count
    there)."""
    h = Harness(demo_model, *combo, fixed_shapes=False)
    differences = 0
    for seed in range(3):
        rng = random.Random(seed)
        anchor = _evidence_question(h.cached, rng, "en", words=rng.randint(1, 3))
        alone = _run(h, [anchor])[0]
        for n_others in (1, 5, 12):
            others = [h.question(rng, rng.choice(["pl", "en"])) for _ in range(n_others)]
            differences += bits(np.asarray(_run(h, [anchor, *others])[0].states)) != bits(np.asarray(alone.states))
    assert differences > 0
