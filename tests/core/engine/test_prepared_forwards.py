"""A backend's `prepare` (the GPU path's tile plan and metadata blob) runs while the pipeline packs, before the
device is taken, and its result reaches that forward's `run`; answers are those of a backend without it."""

from __future__ import annotations

import random

import numpy as np

from basal.core.engine.pipeline import Pipeline
from basal.core.packing.passes import run_to_end
from tests.determinism.harness import Harness
from tests.stub_backend import StubBackend

DEMO = "basal-synthetic-demo"


def uniform(prompt: str, k: int):
    return [1.0 / k] * k if k else [1.0]


class PreparingStub(StubBackend):
    def __init__(self, model):
        super().__init__(model, uniform)
        self.prepared: list[int] = []
        self.received: list[object] = []
        self.preemptible: list[bool] = []

    def prepare(self, batch):
        self.prepared.append(batch.n_tokens)
        return ("prepare", batch.n_tokens)

    def run(self, batch, prepared=None, preemptible=False):
        self.received.append(prepared)
        self.preemptible.append(preemptible)
        return (yield from super().run(batch))


def questions(model, n: int):
    h = Harness.__new__(Harness)
    h.tok = model.tokenizer
    rng = random.Random(2)
    return [h.question(rng, "en", state_words=5, k=3) for _ in range(n)]


def test_prepare_runs_while_packing_and_reaches_the_forward(demo_model):
    backend = PreparingStub(demo_model)
    pipeline = Pipeline(demo_model, backend, tree_max_tokens=200, forward_max_tokens=200)  # several forwards
    qs = questions(demo_model, 6)
    forwards = pipeline.pack_questions(qs)
    assert len(forwards) > 1 and backend.prepared == [f.packed.n_tokens for f in forwards]
    assert not backend.received  # nothing has run yet: packing is host work
    with_plan = run_to_end(pipeline.run_forwards(qs, forwards))
    assert backend.received == [("prepare", f.packed.n_tokens) for f in forwards]
    plain = run_to_end(
        Pipeline(
            demo_model, StubBackend(demo_model, uniform), tree_max_tokens=200, forward_max_tokens=200
        ).letter_logits(qs)
    )
    assert all(
        np.array_equal(a, b) for qa, qb in zip(with_plan, plain, strict=True) for a, b in zip(qa, qb, strict=True)
    )


def test_the_long_lane_asks_for_a_pass_that_can_pause(demo_model):
    """The GPU path replays graphs, which cannot pause; the long lane's passes ask for eager layers instead."""
    import asyncio

    from basal.core.engine.engine import Engine, EngineSettings
    from basal.core.engine.engines import Engines
    from basal.core.engine.gate import Gate
    from basal.core.engine.metrics import Metrics
    from tests.core.engine.test_scheduling import request

    backend = PreparingStub(demo_model)
    metrics = Metrics(8)
    settings = EngineSettings(long_tokens=400)
    engines = Engines({DEMO: Engine(DEMO, Pipeline(demo_model, backend), Gate(), metrics, settings)}, DEMO, metrics)
    engines.start()
    try:
        asyncio.run(engines.run(request(1)))  # short: the main lane
        asyncio.run(engines.run(request(300)))  # over long_tokens: the long lane
    finally:
        engines.close()
    assert backend.preemptible == [False, True]
