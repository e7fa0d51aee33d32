"""A lane keeps two batches in flight on an asynchronous device: once a batch's device work is queued
(`overlap.QUEUED`) the lane lets the gate go, packs and queues its next batch, and only then waits for the first
one's readback and answers it. Answers are those of a synchronous device; a batch's readback never waits behind
another lane's turn; a failure or a client leaving at the readback touches only that batch."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest

from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.errors import Cancelled, EngineClosed
from basal.core.packing.passes import QUEUED, run_to_end
from tests.core.engine.test_scheduling import request
from tests.stub_backend import FakeBackend

DEMO = "basal-synthetic-demo"
WAIT_S = 10.0


class AsyncDevice(FakeBackend):
    """The torch backend as an asynchronous device: a pass computes at its launch and yields QUEUED; its readback
    completes only once the test calls `complete(n)` for it (passes are numbered from 1 in launch order)."""

    def __init__(self, inner: TorchBackend):
        self.inner = inner
        self.name, self.device, self.dtype, self.model = inner.name, inner.device, inner.dtype, inner.model
        self.cv = threading.Condition()
        self.launched = self.completed = 0
        self.failing: set[int] = set()
        self.log: list[str] = []

    def prefix(self, key, tokens) -> None:
        self.inner.prefix(key, tokens)

    def complete(self, n: int) -> None:
        with self.cv:
            self.completed = max(self.completed, n)

    def run(self, batch, prepared=None, preemptible=False):
        logits = run_to_end(self.inner.run(batch))
        with self.cv:
            self.launched += 1
            n = self.launched
            self.log.append(f"launch {n}")
        yield QUEUED
        while True:
            with self.cv:
                if self.completed >= n:
                    break
            yield
            time.sleep(0.001)
        self.log.append(f"read {n}")
        if n in self.failing:
            raise RuntimeError(f"readback {n} failed")
        return logits


@pytest.fixture
def served(demo_model):
    device = AsyncDevice(TorchBackend.load(demo_model))
    metrics = Metrics(1024)
    engine = Engine(demo_model.name, Pipeline(demo_model, device), Gate(), metrics, EngineSettings())
    engines = Engines({demo_model.name: engine}, demo_model.name, metrics, 1024)
    engines.start()
    yield engines, device
    engines.close()


async def until(condition) -> None:
    deadline = time.perf_counter() + WAIT_S
    while not condition():
        assert time.perf_counter() < deadline, "timed out"
        await asyncio.sleep(0.005)


class GateHolder:
    """Another holder of the device, on a thread of its own: `take()` returns once it holds the gate."""

    def __init__(self, gate: Gate):
        self.gate, self.held, self.release = gate, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        with self.gate.hold(urgent=True):
            self.held.set()
            self.release.wait(WAIT_S)

    def take(self) -> GateHolder:
        self.thread.start()
        assert self.held.wait(WAIT_S)
        return self

    def give_back(self) -> None:
        self.release.set()
        self.thread.join()


async def lined_up(engines, *runs) -> list[asyncio.Task]:
    """The lane's batches one request each, in this order: they queue up while the gate is held elsewhere."""
    holder = GateHolder(engines.engines[DEMO].gate).take()
    tasks = []
    for run in runs:
        tasks.append(asyncio.create_task(run))
        await asyncio.sleep(0.15)  # the lane takes the first alone and waits at the gate; the rest queue
    holder.give_back()
    return tasks


def answers(result) -> dict:
    return msgspec.to_builtins(result.response)["answers"]


def test_the_next_batch_is_queued_before_the_last_one_is_answered(served, demo_model):
    engines, device = served
    sync = Engines(
        {DEMO: Engine(DEMO, Pipeline(demo_model, TorchBackend.load(demo_model)), Gate(), Metrics(8))}, DEMO, Metrics(8)
    )
    sync.start()
    expected = [answers(asyncio.run(sync.run(request(5 + i, 2, tag=f"t{i}")))) for i in range(2)]
    sync.close()

    async def main():
        first, second = await lined_up(engines, *(engines.run(request(5 + i, 2, tag=f"t{i}")) for i in range(2)))
        await until(lambda: device.launched == 2)  # queued behind the first, whose readback is still pending
        assert not first.done() and device.log == ["launch 1", "launch 2"]
        device.complete(2)
        return [answers(await asyncio.wait_for(t, WAIT_S)) for t in (first, second)]

    assert asyncio.run(main()) == expected
    assert device.log == ["launch 1", "launch 2", "read 1", "read 2"]


def test_a_batch_in_flight_is_answered_while_its_lane_waits_for_the_device(served, monkeypatch):
    """Another holder takes the gate while the lane packs its second batch: the first batch is finished while
    the lane waits for the device, not after the other holder's turn."""
    engines, device = served
    engine = engines.engines[DEMO]
    device.complete(1)  # the first batch's readback is ready as soon as it is queued
    other = GateHolder(engine.gate)
    pack, packed = engine.pipeline.pack, []

    def packing(*args, **kwargs):
        packed.append(1)
        if len(packed) == 2:  # the second batch: the other holder takes the device meanwhile
            other.take()
        return pack(*args, **kwargs)

    monkeypatch.setattr(engine.pipeline, "pack", packing)

    async def main():
        first, second = await lined_up(
            engines, engines.run(request(5, 1, tag="a")), engines.run(request(6, 1, tag="b"))
        )
        result = await asyncio.wait_for(first, WAIT_S)  # answered while the other still holds the gate
        assert other.held.is_set() and not other.release.is_set() and device.launched == 1
        other.give_back()
        await until(lambda: device.launched == 2)
        device.complete(2)
        await asyncio.wait_for(second, WAIT_S)
        return result

    assert answers(asyncio.run(main()))


def test_a_failed_readback_fails_only_its_batch(served):
    engines, device = served
    device.failing.add(1)

    async def main():
        first, second = await lined_up(
            engines, engines.run(request(5, 1, tag="a")), engines.run(request(6, 1, tag="b"))
        )
        await until(lambda: device.launched == 2)
        device.complete(2)
        with pytest.raises(RuntimeError, match="readback 1 failed"):
            await asyncio.wait_for(first, WAIT_S)
        return await asyncio.wait_for(second, WAIT_S)

    assert answers(asyncio.run(main()))


def test_a_client_that_leaves_during_the_readback_stops_only_its_batch(served):
    engines, device = served
    engine = engines.engines[DEMO]
    gone = threading.Event()

    async def main():
        first, second = await lined_up(
            engines, engines.run(request(5, 1, tag="a"), gone.is_set), engines.run(request(6, 1, tag="b"))
        )
        await until(lambda: device.launched == 2)
        gone.set()
        with pytest.raises(Cancelled):
            await asyncio.wait_for(first, WAIT_S)
        device.complete(2)
        return await asyncio.wait_for(second, WAIT_S)

    assert answers(asyncio.run(main()))
    assert engine.stopped_batches == 1 and engine.computed_jobs == 1
    assert "read 1" not in device.log  # stopped at a readback checkpoint, before its result was taken


def test_before_wait_runs_only_when_the_device_is_busy():
    gate, ran, got = Gate(), [], threading.Event()
    with gate.hold(urgent=True, before_wait=lambda: ran.append("free")):
        pass
    assert ran == []  # the device was free: nothing to do first
    other = GateHolder(gate).take()

    def lane():
        with gate.hold(urgent=True, before_wait=lambda: ran.append("busy")):
            got.set()

    waiter = threading.Thread(target=lane)
    waiter.start()
    deadline = time.perf_counter() + WAIT_S
    while not ran and time.perf_counter() < deadline:
        time.sleep(0.005)
    assert ran == ["busy"] and not got.is_set()  # it ran while the lane still waited
    other.give_back()
    waiter.join(WAIT_S)
    assert got.is_set() and ran == ["busy"]  # once, then the lane had the device


@pytest.mark.parametrize("abandon", [False, True])
def test_shutdown_with_a_batch_in_flight(served, abandon):
    """Draining answers the batch in flight once its readback lands; abandoning stops it there (503)."""
    engines, device = served

    async def main():
        first = asyncio.create_task(engines.run(request(5, 1, tag="a")))
        await until(lambda: device.launched == 1)
        closing = asyncio.create_task(asyncio.to_thread(engines.close, drain=not abandon, abandon=abandon))
        await asyncio.sleep(0.05)
        device.complete(1)
        await asyncio.wait_for(closing, WAIT_S)
        return await asyncio.wait_for(first, WAIT_S)

    if abandon:
        with pytest.raises(EngineClosed):
            asyncio.run(main())
        assert "read 1" not in device.log
    else:
        assert answers(asyncio.run(main())) and device.log == ["launch 1", "read 1"]
