"""Across backends: the same decisions, f32 letter logits within 1e-4 of each other and within 3e-4 of
transformers (every prompt run alone, eagerly)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from basal.core.decision.distribution import distribution
from basal.core.model.prompt import option_orders
from tests.backends.test_agreement import _transformers_letter_logits
from tests.determinism.harness import Harness, available, combo_id

COMBOS = available()
F32 = [c for c in COMBOS if c[2] == "f32"]


@pytest.fixture(scope="module")
def questions_and_reference(demo_model):
    h = Harness(demo_model, "torch", "cpu", "f32")
    rng = random.Random(42)
    qs = [h.question(rng, rng.choice(["pl", "en"]), state_words=rng.randint(3, 70)) for _ in range(8)]
    qs += [h.question(rng, "en", state=qs[1].state) for _ in range(3)]
    return qs, h.logits(qs)


def _decisions(logits):
    return [distribution([o for o in q], option_orders(len(q[0])), 1.4).argmax for q in logits]


@pytest.mark.parametrize("combo", F32, ids=combo_id)
def test_f32_logits_agree_with_torch_and_transformers(demo_model, questions_and_reference, combo):
    qs, reference = questions_and_reference
    ours = Harness(demo_model, *combo).logits(qs)
    diff = max(
        float(np.abs(a - b).max()) for qa, qb in zip(ours, reference, strict=True) for a, b in zip(qa, qb, strict=True)
    )
    assert diff <= 1e-4, diff
    prompts = [p for q in qs for p in q.prompts]
    hf = iter(_transformers_letter_logits(demo_model.path, prompts, Harness(demo_model, *combo).cached.letter_ids))
    worst = max(float(np.abs(o - next(hf)[: len(o)]).max()) for q in ours for o in q)
    assert worst <= 3e-4, worst
    assert _decisions(ours) == _decisions(reference)


@pytest.mark.parametrize("combo", [c for c in COMBOS if c[2] != "f32"], ids=combo_id)
def test_16_bit_decisions_match_f32_where_f32_is_not_a_near_tie(demo_model, questions_and_reference, combo):
    qs, reference = questions_and_reference
    ours = Harness(demo_model, *combo).logits(qs)
    for q16, q32 in zip(ours, reference, strict=True):
        p32 = distribution(q32, option_orders(len(q32[0])), 1.4).p_cal
        top2 = np.sort(p32)[-2:]
        if top2[1] - top2[0] > 0.02:
            assert _decisions([q16]) == _decisions([q32])


@pytest.mark.parametrize("combo", F32, ids=combo_id)
def test_f32_evidence_rows_agree_with_transformers_last_hidden_state(demo_model, combo):
    """The rows the pointer head reads are Hugging Face's `last_hidden_state` (after the final RMSNorm) of the
    order-1 prompt: its state tokens and its last token (docs: evidence)."""
    import torch
    from transformers import LlamaForCausalLM

    from tests.determinism.test_evidence_rows import _evidence_question, _run

    h = Harness(demo_model, *combo)
    rng = random.Random(8)
    qs = [_evidence_question(h.cached, rng, lang, words=rng.randint(3, 40)) for lang in ("pl", "en")]
    hf = LlamaForCausalLM.from_pretrained(demo_model.path, dtype=torch.float32, attn_implementation="eager").eval()
    for q, ours in zip(qs, _run(h, qs), strict=True):
        with torch.no_grad():
            hidden = hf.model(torch.tensor([q.prompts[0]])).last_hidden_state[0].numpy()
        theirs = hidden[[*q.hidden, len(q.prompts[0]) - 1]]
        assert np.abs(np.asarray(ours.states) - theirs).max() <= 1e-4 * max(1.0, float(np.abs(theirs).max()))
