"""jevbench's ``examples`` suite against a live server: its five batch-independence relations hold with deviation
exactly 0.0; a negative control (a backend that perturbs logits by batch position) fails them."""

from __future__ import annotations

import numpy as np
import pytest

from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from tests.servers import live_server
from tests.stub_backend import FakeBackend

jevbench = pytest.importorskip("jevbench")

BAT = ("batch_solo", "batch_order", "duplicate_question", "batch_content", "batch_size_sweep")


def deviations(report) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for o in report.result["outcomes"]:
        out.setdefault(o["relation"], []).append(o["deviation"])
    return out


def test_examples_suite_batch_independence_is_exact(server):
    url, _engines = server
    report = jevbench.evaluate(
        jevbench.systemone(url + "/v1/systemone", model="jev-latest"), "examples", relations=list(BAT), cache=None
    )
    assert not report.result["errors"]
    found = deviations(report)
    assert set(found) == set(BAT) and all(d == 0.0 for ds in found.values() for d in ds), found


class BatchPositionBackend(FakeBackend):
    """The torch backend with one defect: each readout's first letter logit moves by its position in the packed
    batch, so a question's answer depends on what it is batched with (what the BAT relations exist to catch)."""

    def __init__(self, inner: TorchBackend, step: float = 0.5):
        self.inner, self.step = inner, step
        self.name, self.device, self.dtype, self.model = inner.name, inner.device, inner.dtype, inner.model

    def prefix(self, key, tokens):
        self.inner.prefix(key, tokens)

    def run(self, batch, prepared=None, preemptible=False):
        logits = yield from self.inner.run(batch)
        logits = np.array(logits, dtype=np.float32)
        logits[:, 0] += self.step * np.arange(len(logits), dtype=np.float32)  # readout r of the batch: + r * step
        return logits


def test_a_backend_that_depends_on_batch_position_fails_it(demo_model):
    """Negative control: the same suite against a server whose backend perturbs logits by batch position."""
    backend = BatchPositionBackend(TorchBackend.load(demo_model))
    engine = Engine(demo_model.name, Pipeline(demo_model, backend), Gate(100.0), Metrics(64), EngineSettings())
    engines = Engines({demo_model.name: engine}, demo_model.name, Metrics(64), 64)
    with live_server(engines) as url:
        model = jevbench.systemone(url + "/v1/systemone", model="jev-latest")
        report = jevbench.evaluate(model, "examples", relations=list(BAT), cache=None)
    found = deviations(report)
    assert any(d > 0.0 for ds in found.values() for d in ds), found
    assert any(o["violated"] for o in report.result["outcomes"])
