"""The long lane's floor on device time (`Gate(long_share=…)`): under a stream of main-lane turns that never
stops, a long pass still starts, gets its share, and finishes — and main lanes still preempt it.

The gate tests drive the gate from threads with sleeps for slices (no model); each has a negative control with
the floor off (`long_share=0`), where the same stream starves the long lane. The engine test runs requests
through `Engines` on a stub backend whose passes take a set time per pause point.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.packing.tree import PackedForward
from tests.core.engine.test_scheduling import request
from tests.stub_backend import StubBackend


class MainStream:
    """`clients` threads taking main-lane turns of `hold_s` back to back: from the first turn on, a main lane is
    always waiting (one holds, the others queue), so a long lane never finds the gate free of them."""

    def __init__(self, gate: Gate, hold_s: float, clients: int = 3):
        self.gate, self.hold_s = gate, hold_s
        self.turns = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        while not self._stop.is_set():
            with self.gate.hold(urgent=True):
                time.sleep(self.hold_s)
                with self._lock:
                    self.turns += 1

    def __enter__(self) -> MainStream:
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + 10
        while not self.gate.urgent_waiting() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert self.gate.urgent_waiting(), "the main stream did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


class LongPass(threading.Thread):
    """A long-lane pass of `steps` pause points, `step_s` of work before each."""

    def __init__(self, gate: Gate, steps: int, step_s: float):
        super().__init__(daemon=True)
        self.gate, self.steps, self.step_s = gate, steps, step_s
        self.started = threading.Event()
        self.done = threading.Event()
        self.stop = threading.Event()  # end the pass at its next pause point
        self.yielded = 0

    def run(self) -> None:
        with self.gate.hold(urgent=False) as holder:
            self.started.set()
            for _ in range(self.steps):
                if self.stop.is_set():
                    break
                time.sleep(self.step_s)
                self.yielded += holder.checkpoint()
        self.done.set()


def wait_while_streaming(stream: MainStream, long: LongPass, max_turns: int) -> bool:
    """Wait until the long pass is done or the stream has taken `max_turns` turns; True if the pass finished."""
    while not long.done.is_set() and stream.turns < max_turns:
        long.done.wait(0.005)
    return long.done.is_set()


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_a_long_pass_starts_and_finishes_under_a_stream_that_never_stops(share):
    gate = Gate(slice_ms=5, long_share=share)
    long = LongPass(gate, steps=20, step_s=0.005)
    with MainStream(gate, hold_s=0.02) as stream:
        long.start()
        finished = wait_while_streaming(stream, long, max_turns=2000)  # a bound for a frozen machine only
        turns_during = stream.turns
    long.join(10)
    assert finished, "the long pass did not finish while main turns kept coming"
    assert turns_during > 0
    assert gate.floor_turns >= 1  # the floor let it in ahead of waiting main lanes
    assert long.yielded >= 1 and gate.preemptions >= 1  # and main lanes still preempted it


def test_without_the_floor_the_same_stream_starves_the_long_pass():
    """Negative control: with `long_share=0` the long pass never even starts while the stream runs."""
    gate = Gate(slice_ms=5, long_share=0.0)
    long = LongPass(gate, steps=20, step_s=0.005)
    with MainStream(gate, hold_s=0.02) as stream:
        long.start()
        finished = wait_while_streaming(stream, long, max_turns=60)
        started_during = long.started.is_set()
    long.join(10)
    assert not finished and not started_during
    assert long.done.is_set()  # once the stream stops, it runs
    assert gate.floor_turns == 0


def running_share(share: float) -> float:
    """The long lane's share of the device while a stream of 100 ms main turns runs beside a pass that pauses
    every 2 ms with 1 ms slices (without a floor it gets one slice, about 2 ms, per main turn)."""
    gate = Gate(slice_ms=1, long_share=share)
    long = LongPass(gate, steps=100_000, step_s=0.002)
    long.start()
    long.started.wait(10)
    with MainStream(gate, hold_s=0.1) as stream:
        while stream.turns < 10:
            time.sleep(0.01)
        seen = gate.long_share_seen()
    long.stop.set()
    long.join(10)
    assert long.done.is_set()
    return seen


def test_a_running_long_pass_keeps_its_share():
    assert running_share(0.25) >= 0.22  # the floor, less at most one main turn's share over ~1.3 s
    assert running_share(0.0) < 0.2  # negative control: one slice per main turn (~0.02; 0.2 if sleeps overrun)


def test_the_floor_must_be_a_fraction():
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match="long_share"):
            Gate(long_share=bad)


class TimedStub(StubBackend):
    """A stub model whose passes on the long lane take `long_steps` pause points of `step_s` and those on the main
    lane one of `short_s`; counts the main-lane batches that run while a long pass is under way."""

    def __init__(self, model, short_s: float, step_s: float, long_steps: int):
        super().__init__(model, lambda prompt, k: [0.7, 0.3][:k] if k == 2 else [1.0 / k] * k)
        self.short_s, self.step_s, self.long_steps = short_s, step_s, long_steps
        self.long_running = False
        self.shorts_during_long = 0

    def run(self, batch: PackedForward, prepared=None, preemptible=False):
        if threading.current_thread().name.endswith(("-long", "-background")):  # lane threads: basal-MODEL-LANE
            self.long_running = True
            try:
                for _ in range(self.long_steps):
                    time.sleep(self.step_s)
                    yield
            finally:
                self.long_running = False
        else:
            self.shorts_during_long += self.long_running
            time.sleep(self.short_s)
            yield
        return (yield from super().run(batch))


def long_under_short_stream(demo_model, share: float) -> tuple[bool, int, int]:
    """A long request (200 pause points of 2 ms, 1 ms slices) while short requests arrive faster than the device
    answers them (one every 20 ms, 250 ms per batch). Returns (same answer as alone, short batches that ran during
    the long pass, preemptions). Without a floor the long lane gets about one pause point per main-lane turn (~100
    turns); with `share` 0.25 short batches get about 3× its own ~0.4 s of device time (a few turns)."""
    long_req = request(400, 1, tag="long")
    backend = TimedStub(demo_model, short_s=0.25, step_s=0.002, long_steps=200)
    metrics, gate = Metrics(4096), Gate(slice_ms=1, long_share=share)
    engine = Engine(demo_model.name, Pipeline(demo_model, backend), gate, metrics, EngineSettings(long_tokens=1000))
    engines = Engines({demo_model.name: engine}, demo_model.name, metrics, 4096)
    engines.start()
    alone = asyncio.run(engines.run(long_req)).response
    assert engine.admit(long_req, print, lambda: False).cost > 1000  # it takes the long lane
    backend.shorts_during_long = 0

    async def main():
        shorts = [asyncio.create_task(engines.run(request(2, 1, tag="first")))]
        await asyncio.sleep(0.02)  # the stream runs before the long request arrives
        long_task = asyncio.create_task(engines.run(long_req))
        i = 0
        while not long_task.done():
            shorts.append(asyncio.create_task(engines.run(request(2, 1, tag=f"s{i}"))))
            i += 1
            await asyncio.sleep(0.02)
            assert i < 5_000, "the long request did not finish under the short stream"
        await asyncio.gather(*shorts)
        return (await long_task).response

    during = asyncio.run(main())
    engines.close()
    return during == alone, backend.shorts_during_long, gate.preemptions


def test_engine_finishes_a_long_request_under_a_constant_short_stream(demo_model):
    same, shorts_during, preemptions = long_under_short_stream(demo_model, 0.25)
    assert same
    assert 1 <= shorts_during < 20  # short requests still overtook the long pass, and the floor bounded them
    assert preemptions >= 1
