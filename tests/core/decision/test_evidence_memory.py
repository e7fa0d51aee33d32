"""Evidence on many questions about one state: what each question keeps between the forward and the answer (its
state tokens' offsets, hidden rows and hidden states) is a few references to what the state's questions share,
so memory grows with the state once, not with questions x state."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.pipeline import Pipeline
from basal.core.packing.passes import run_to_end
from basal.core.request.dialects import parse_basal

STATE = "Paczka dotarła uszkodzona, klient chce zwrotu pieniędzy i przeprosin. " * 6


def _kept(pipeline: Pipeline, questions: int) -> tuple[int, int]:
    """Bytes still traced once a request's forward has run and its results are taken (numpy arrays included),
    minus its prompts' own token tuples; and the prompt tokens."""
    asked = {
        f"q{i}": {"type": "noul", "instructions": f"Czy to przypadek {i}?", "evidence": True} for i in range(questions)
    }
    request = parse_basal({"state": STATE, "questions": asked}, lambda _m: "m", serves_evidence=lambda _m: True)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rounds = pipeline.first_round(request)
        tokenized = rounds.tokenized
        pipeline.advance(rounds, run_to_end(pipeline.letter_logits(tokenized)))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    prompts = sum(len(p) for t in tokenized for p in t.prompts)
    assert len(rounds.states) == questions and all(np.asarray(s).shape[0] > 100 for s in rounds.states.values())
    return kept - 8 * prompts, prompts


def test_evidence_keeps_no_copy_of_the_state_per_question(demo_model):
    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))
    _kept(pipeline, 4)  # warm up
    small, _ = _kept(pipeline, 8)
    large, _ = _kept(pipeline, 24)
    per_question = (large - small) / 16
    # one question's copy of the state's hidden rows alone would be ~90 KB here (~350 tokens x 64 x 4 B)
    assert per_question < 6_000, per_question
