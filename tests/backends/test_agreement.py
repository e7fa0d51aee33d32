"""Agreement with an independent implementation: transformers' LlamaForCausalLM, eager, f32, every prompt run
separately and whole. basal's letter logits (packed tree, template-prefix cache) must agree to 3e-4 and every
decision must be the same."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from basal.core.decision.distribution import distribution
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import option_orders
from basal.core.model.synth import synth_model
from tests.determinism.harness import Harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _transformers_letter_logits(path, prompts: list[tuple[int, ...]], letter_ids: list[int]) -> list[np.ndarray]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            logits = model(torch.tensor([p])).logits[0, -1]
            out.append(logits[letter_ids].numpy())
    return out


def _agree(model: ModelDir, n_questions: int):
    h = Harness(model, "torch", "cpu", "f32")
    rng = random.Random(5)
    questions = [h.question(rng, rng.choice(["pl", "en"]), state_words=rng.randint(5, 80)) for _ in range(n_questions)]
    questions += [h.question(rng, "pl", state=questions[0].state) for _ in range(3)]  # a shared state
    ours = h.logits(questions)
    prompts = [p for q in questions for p in q.prompts]
    ref = iter(_transformers_letter_logits(model.path, prompts, h.cached.letter_ids))
    worst, decisions = 0.0, 0
    for q, logits in zip(questions, ours, strict=True):
        k = len(logits[0])
        theirs = [next(ref)[:k] for _ in q.prompts]
        worst = max(worst, max(float(np.abs(a - b).max()) for a, b in zip(logits, theirs, strict=True)))
        t = model.calibration.temperature("choice")
        same = distribution(logits, option_orders(k), t).argmax == distribution(theirs, option_orders(k), t).argmax
        decisions += same
    return worst, decisions, len(questions)


def test_demo_model_agrees_with_transformers(demo_model):
    worst, same, n = _agree(demo_model, 10)
    assert worst <= 3e-4, worst
    assert same == n


@pytest.mark.slow
def test_mini_shapes_agree_with_transformers(tmp_path):
    model = ModelDir.load(synth_model(tmp_path / "mini2", "mini", layers=2))
    worst, same, n = _agree(model, 4)
    assert worst <= 3e-4, worst
    assert same == n
