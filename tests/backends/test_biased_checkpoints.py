"""basal-1.0 checkpoints carry attention and MLP biases (basal-1.5 has none). Every backend serves them: f32 letter
logits agree with transformers' LlamaForCausalLM to 3e-4 (a model with its biases dropped is far off, so the check
sees a backend that ignores them), and a question's bits are the same alone and in a batch."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.backends.test_agreement import _transformers_letter_logits
from tests.determinism.harness import Harness, available, combo_id, same_bits

F32 = [c for c in available() if c[2] == "f32"]


@pytest.fixture(scope="module")
def questions(biased_model):
    h = Harness(biased_model, "torch", "cpu", "f32")
    rng = random.Random(11)
    qs = [h.question(rng, rng.choice(["pl", "en"]), state_words=rng.randint(3, 30)) for _ in range(4)]
    return [*qs, h.question(rng, "en", state=qs[0].state)]


@pytest.fixture(scope="module")
def reference(biased_model, questions):
    """transformers' letter logits, every prompt alone: with the checkpoint's biases, and with them zeroed."""
    from transformers import LlamaForCausalLM

    letters = Harness(biased_model, "torch", "cpu", "f32").cached.letter_ids
    prompts = [p for q in questions for p in q.prompts]
    with_bias = _transformers_letter_logits(biased_model.path, prompts, letters)
    model = LlamaForCausalLM.from_pretrained(biased_model.path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
        no_bias = [model(torch.tensor([p])).logits[0, -1][letters].numpy() for p in prompts]
    return with_bias, no_bias


def _worst(ours, theirs) -> float:
    flat = iter(theirs)
    return max(float(np.abs(o - next(flat)[: len(o)]).max()) for q in ours for o in q)


@pytest.mark.parametrize("combo", F32, ids=combo_id)
def test_f32_logits_agree_with_transformers_biases_included(biased_model, questions, reference, combo):
    ours = Harness(biased_model, *combo).logits(questions)
    with_bias, no_bias = reference
    assert _worst(ours, with_bias) <= 3e-4
    assert _worst(ours, no_bias) > 0.05  # the biases move the logits far more than the tolerance


@pytest.mark.parametrize("combo", [c for c in available() if c[2] == "bf16"], ids=combo_id)
def test_a_question_has_the_same_bits_alone_and_in_a_batch(biased_model, questions, combo):
    h = Harness(biased_model, *combo)
    together = h.logits(questions)
    for i, q in enumerate(questions):
        assert same_bits(h.logits([q])[0], together[i]), i
