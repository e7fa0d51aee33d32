"""Two forwards in flight (`basal.core.packing.passes`): on an asynchronous device the next forward is queued before the
previous one's result is waited for; synchronous passes run one after the other as before; a stop or a failure
closes every pass in flight; the pipeline's answers do not change."""

from __future__ import annotations

import numpy as np
import pytest

from basal.core.engine.pipeline import Pipeline
from basal.core.packing.passes import QUEUED, overlapped, run_to_end
from tests.core.engine.test_prepared_forwards import questions, uniform
from tests.stub_backend import StubBackend


def device_pass(i: int, log: list[str], asynchronous: bool = True, fail: bool = False):
    """A pass on a fake device: launches, a checkpoint, QUEUED when asynchronous, then its readback."""
    try:
        log.append(f"launch {i}")
        if fail:
            raise RuntimeError(f"pass {i} failed")
        yield
        if asynchronous:
            yield QUEUED
        log.append(f"read {i}")
        yield
        return i * 10
    except GeneratorExit:
        log.append(f"closed {i}")
        raise


def drive(steps, log: list[str]) -> int:
    """Run `steps` to its end; -> how many times it yielded QUEUED (each one logged where it came)."""
    queued = 0
    while True:
        try:
            step = next(steps)
        except StopIteration:
            return queued
        if step is QUEUED:
            queued += 1
            log.append("QUEUED")


def test_the_next_pass_is_queued_before_the_previous_result_is_read():
    log, results = [], {}
    queued = drive(overlapped((device_pass(i, log) for i in range(3)), results.__setitem__), log)
    assert log == ["launch 0", "launch 1", "read 0", "launch 2", "read 1", "QUEUED", "read 2"]
    assert results == {0: 0, 1: 10, 2: 20} and queued == 1


def test_synchronous_passes_run_one_after_the_other():
    log, results = [], {}
    queued = drive(overlapped((device_pass(i, log, asynchronous=False) for i in range(3)), results.__setitem__), log)
    assert log == ["launch 0", "read 0", "launch 1", "read 1", "launch 2", "read 2"]
    assert results == {0: 0, 1: 10, 2: 20} and queued == 0


def test_a_stop_closes_every_pass_in_flight():
    log = []
    steps = overlapped((device_pass(i, log) for i in range(3)), lambda i, r: None)
    while log[-1:] != ["launch 1"]:
        next(steps)
    steps.close()  # the engine stops a pass whose clients have gone
    assert sorted(entry for entry in log if entry.startswith("closed")) == ["closed 0", "closed 1"]


def test_a_failing_pass_closes_the_one_in_flight():
    log = []
    passes = (device_pass(i, log, fail=i == 1) for i in range(3))
    with pytest.raises(RuntimeError, match="pass 1 failed"):
        drive(overlapped(passes, lambda i, r: None), log)
    assert log == ["launch 0", "launch 1", "closed 0"]


class QueueingStub(StubBackend):
    """The stub backend as an asynchronous device: QUEUED after its launch, the readback after."""

    def __init__(self, model):
        super().__init__(model, uniform)
        self.log: list[str] = []

    def run(self, batch, prepared=None, preemptible=False):
        self.log.append(f"launch {batch.n_tokens}")
        steps = super().run(batch)
        yield QUEUED
        logits = yield from steps
        self.log.append(f"read {batch.n_tokens}")
        return logits


def test_pipeline_overlaps_a_batchs_forwards_with_the_same_answers(demo_model):
    backend = QueueingStub(demo_model)
    pipeline = Pipeline(demo_model, backend, tree_max_tokens=200, forward_max_tokens=200)
    qs = questions(demo_model, 6)
    forwards = pipeline.pack_questions(qs)
    assert len(forwards) > 2
    overlapped_logits = run_to_end(pipeline.run_forwards(qs, forwards))
    sizes = [f.packed.n_tokens for f in forwards]
    assert backend.log[:3] == [f"launch {sizes[0]}", f"launch {sizes[1]}", f"read {sizes[0]}"]
    plain = run_to_end(
        Pipeline(
            demo_model, StubBackend(demo_model, uniform), tree_max_tokens=200, forward_max_tokens=200
        ).letter_logits(qs)
    )
    assert all(
        np.array_equal(a, b)
        for qa, qb in zip(overlapped_logits, plain, strict=True)
        for a, b in zip(qa, qb, strict=True)
    )
