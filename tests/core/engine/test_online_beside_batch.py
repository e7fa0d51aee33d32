"""An online request beside a running batch waits for at most one pause point of the batch's pass, and the batch's
host work (admitting lines, packing their passes) waits while an online request has work.

Shown with a deterministic gate and no clock: the pipeline double's passes take `STEPS` pause points and record
every admission, pack and step; a step can be held until the test lets it go. The gate's slice is a minute, so
nothing here can pass because time went by: only the order of events counts. The batch's floor under an online
client that never stops is shown with a clock the double moves by hand (`HandClock`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.seam import Admitted, Answer, Facts, Stats
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.limits import Limits

WAIT_S = 10
STEPS = 3  # pause points of every pass
MAX_BATCH_TOKENS = 100
MODEL = "double"


@dataclass(frozen=True)
class Req:
    """A request of the double: `tokens` packed tokens of its own (nothing shared with another request)."""

    name: str
    tokens: int
    model: str = MODEL
    questions: tuple = ()


@dataclass(eq=False)
class Named:
    name: str


@dataclass
class DoublePass:
    stats: Stats
    states: list[Named]
    label: str = field(init=False)

    def __post_init__(self) -> None:
        self.label = "+".join(s.name for s in self.states)


class Held:
    """One held step: `reached` once the pass stands there (holding the device), and it goes on at `release()`."""

    def __init__(self) -> None:
        self.reached, self._go = threading.Event(), threading.Event()

    def release(self) -> None:
        self._go.set()

    def wait(self) -> None:
        self.reached.set()
        assert self._go.wait(WAIT_S), "the test never released this step"


class Stepped:
    """A pipeline double whose passes record ("admit" | "pack" | "step", pass label, step) in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int]] = []
        self.pack_tokens: dict[str, int] = {}
        self.held: dict[tuple[str, int], Held] = {}
        self._lock = threading.Lock()
        self._next_id = 0

    def hold(self, label: str, step: int) -> Held:
        self.held[(label, step)] = held = Held()
        return held

    def _record(self, what: str, label: str, step: int = 0) -> None:
        with self._lock:
            self.events.append((what, label, step))

    def facts(self) -> Facts:
        return Facts("test", None, False, {}, context=64, max_token_chars=4, prefix_tokens={})  # type: ignore[arg-type]

    def admit(self, request: Req, limits: Limits | None = None, cancelled=lambda: False) -> Admitted:
        self._record("admit", request.name)
        with self._lock:
            start, self._next_id = self._next_id, self._next_id + request.tokens
        ids = tuple(range(start, start + request.tokens))
        return Admitted([TokenizedQuestion("en", request.name, (ids,))], request.tokens, Named(request.name))

    def cached_prefix(self, question) -> None:
        return None  # no state cache: every token is computed

    def pack(self, states, stats=None) -> DoublePass:
        packed = DoublePass(stats or Stats(), list(states))
        self._record("pack", packed.label)
        return packed

    def forward(self, packed: DoublePass, preemptible: bool = False):
        for i in range(STEPS):
            self._record("step", packed.label, i)
            if (held := self.held.get((packed.label, i))) is not None:
                held.wait()  # holding the device, inside the pass
            yield  # a pause point
        return {s: [s.name] for s in packed.states}

    def settle(self, state: Named, rows, arrival: float, cancelled=lambda: False) -> Answer:
        return Answer(rows)  # type: ignore[arg-type]

    def steps(self) -> list[tuple[str, int]]:
        return [(label, i) for what, label, i in self.events if what == "step"]


def host_turn(gate: Gate) -> None:
    """An empty section of background host work: returns once it could run."""
    with gate.host_work():
        pass


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition of the engine's state (not for time to pass: the test never asserts a duration)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.001)


class Rig:
    def __init__(self, long_tokens: int):
        self.pipeline = Stepped()
        self.gate = Gate(slice_ms=60_000)  # a slice that never ends within a test
        settings = EngineSettings(max_batch_tokens=MAX_BATCH_TOKENS, long_tokens=long_tokens)
        self.metrics = Metrics()
        self.engine = Engine(MODEL, self.pipeline, self.gate, self.metrics, settings)
        self.answers: dict[str, object] = {}
        self._done = threading.Condition()
        self.engine.start()

    def submit(self, name: str, tokens: int, background: bool) -> None:
        def finish(result: object) -> None:
            with self._done:
                self.answers[name] = result
                self._done.notify_all()

        self.engine.submit(self.engine.admit(Req(name, tokens), finish, lambda: False, background))

    def answered(self, *names: str) -> None:
        with self._done:
            assert self._done.wait_for(lambda: all(n in self.answers for n in names), WAIT_S), sorted(self.answers)
        for n in names:
            assert isinstance(self.answers[n], Answer), self.answers[n]


LANES = pytest.mark.parametrize("long_tokens", [4096, 0], ids=["on the long lane", "on the background lane"])


@LANES
def test_an_online_request_runs_at_the_next_pause_of_a_batch_pass_before_any_other_batch_pass(long_tokens):
    rig = Rig(long_tokens)
    a = rig.pipeline.hold("a", 0)
    rig.submit("a", 60, background=True)
    assert a.reached.wait(WAIT_S)  # the batch pass holds the device, inside its first step
    for name in ("b1", "b2", "b3"):  # more lines, queued behind it
        rig.submit(name, 40, background=True)
    rig.submit("online", 10, background=False)
    until(rig.gate.urgent_waiting, "the online request waits for the device")
    a.release()
    rig.answered("a", "b1", "b2", "b3", "online")
    steps = rig.pipeline.steps()
    # the online pass ran at the batch pass's next pause point (between its steps 0 and 1), before it went on ...
    assert steps[: 2 + STEPS] == [("a", 0), *(("online", i) for i in range(STEPS)), ("a", 1)], steps
    # ... and every later batch pass came after it, each within max_batch_tokens
    passes = list(dict.fromkeys(label for label, _ in steps))
    assert passes == ["a", "online", "b1+b2", "b3"], passes
    assert rig.gate.preemptions == 1
    rig.engine.close()


@LANES
def test_a_batch_pass_is_not_packed_while_an_online_pass_computes(long_tokens):
    rig = Rig(long_tokens)
    online = rig.pipeline.hold("online", 0)
    rig.submit("online", 10, background=False)
    assert online.reached.wait(WAIT_S)  # the online pass holds the device
    rig.submit("line", 40, background=True)
    until(
        lambda: rig.gate.host_waiting() == 1 or ("pack", "line", 0) in rig.pipeline.events,
        "the batch lane packs its pass or waits for its turn",
    )
    assert ("pack", "line", 0) not in rig.pipeline.events  # it waits: its host work would slow the online pass
    online.release()
    rig.answered("online", "line")
    events = rig.pipeline.events
    assert events.index(("pack", "line", 0)) > events.index(("step", "online", STEPS - 1))
    rig.engine.close()


def test_a_batch_line_is_not_admitted_while_an_online_pass_computes():
    """Lines are admitted (tokenized, costed) in a pool of their own, each when no online request has work."""
    rig = Rig(4096)
    engines = Engines({MODEL: rig.engine}, MODEL, rig.metrics)
    online = rig.pipeline.hold("online", 0)
    rig.submit("online", 10, background=False)
    assert online.reached.wait(WAIT_S)
    line: list[object] = []
    runner = threading.Thread(target=lambda: line.append(asyncio.run(engines.run(Req("line", 40), background=True))))
    runner.start()
    until(
        lambda: rig.gate.host_waiting() == 1 or ("admit", "line", 0) in rig.pipeline.events,
        "the line is admitted or waits for its turn",
    )
    assert ("admit", "line", 0) not in rig.pipeline.events
    online.release()
    runner.join(WAIT_S)
    rig.answered("online")
    assert line and line[0].response == ["line"]  # type: ignore[attr-defined]
    assert rig.pipeline.events.index(("admit", "line", 0)) > rig.pipeline.events.index(("step", "online", STEPS - 1))
    engines.close()


def test_batch_host_work_waits_until_no_online_work_is_left_or_it_is_below_its_floor():
    """`host_work` waits while a main lane has work, unless the long lane is below its floor (`long_share`): the
    main lanes' busy time while it waits counts against the floor, as if it waited for the device."""

    def waiting(gate: Gate) -> tuple[threading.Thread, threading.Event]:
        released = threading.Event()
        worker = threading.Thread(target=lambda: (host_turn(gate), released.set()))
        worker.start()
        until(lambda: gate.host_waiting() == 1, "the batch's host work waits for the online work")
        return worker, released

    gate = Gate(slice_ms=1, long_share=0.5)
    gate.online(True)
    worker, released = waiting(gate)
    gate.online(False)  # the online work is done
    assert released.wait(WAIT_S)
    worker.join(WAIT_S)

    gate = Gate(slice_ms=1, long_share=0.5)
    gate.online(True)
    worker, released = waiting(gate)
    with gate.hold(urgent=True):  # an online pass of 10 ms: half of it is owed to the waiting batch, over its 1 ms bank
        time.sleep(0.01)
    assert released.wait(WAIT_S)  # below its floor: it goes on although the main lane still has work
    worker.join(WAIT_S)
    gate.online(False)


def test_batch_host_work_does_not_wait_for_an_engine_that_closed_with_online_work():
    engine = Engine(MODEL, Stepped(), Gate(), Metrics(), EngineSettings())  # never started: its online job never runs
    engine.submit(engine.admit(Req("online", 10), lambda result: None, lambda: False))
    released = threading.Event()
    worker = threading.Thread(target=lambda: (host_turn(engine.gate), released.set()))
    worker.start()
    until(lambda: engine.gate.host_waiting() == 1, "the batch's host work waits for the online job")
    engine.close(drain=False, timeout=0)
    assert released.wait(WAIT_S)
    worker.join(WAIT_S)


class HandClock:
    """The gate's clock, moved only by the double's work: a test of the floor's accounting with no real time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


ONLINE_PACK_S, BATCH_PACK_S, STEP_S = 0.009, 0.001, 0.001  # an online pass's host work is most of its time


class Costed(Stepped):
    """`Stepped` whose packing and steps take hand-clock time: an online request's host work three times its device
    work (as a small model's on a CPU), a batch pass's little. The online lane's clock moves one tick at a time,
    each once the batch waits in the gate (for its host work's turn or for the device): what a tick of the online
    lane's time means for the batch then depends on the gate alone, not on which thread ran first."""

    def __init__(self, clock: HandClock, gate: Gate) -> None:
        super().__init__()
        self.clock, self.gate = clock, gate

    def _online_tick(self) -> None:
        gate = self.gate
        until(lambda: parked(gate), "the batch waits in the gate")
        self.clock.advance(STEP_S)
        gate.tick()

    def pack(self, states, stats=None) -> DoublePass:
        packed = super().pack(states, stats)
        if packed.label.startswith("o"):
            for _ in range(round(ONLINE_PACK_S / STEP_S)):
                self._online_tick()
        else:
            self.clock.advance(BATCH_PACK_S)
        return packed

    def forward(self, packed: DoublePass, preemptible: bool = False):
        for _ in super().forward(packed, preemptible):
            if packed.label.startswith("o"):
                self._online_tick()
            else:
                self.clock.advance(STEP_S)
            yield
        return {s: [s.name] for s in packed.states}


def parked(gate: Gate) -> bool:
    """The batch waits in the gate and will until something changes there: its host work for its turn (not below
    its floor), or its pass for the device (held, or owed to a main lane after it stepped aside)."""
    with gate._cv:
        gate._charge(gate.clock())
        host = gate._host_waiting and not gate._in_debt()
        return bool(host or (gate._long_waiting and (gate._held or gate._owed)))


def batch_share_beside_a_stream(long_tokens: int, online_passes: int) -> tuple[float, int, int, int]:
    """A batch of lines beside an online client that always has the next request queued (each request is sent
    when the one before is answered, so the main lane never runs out of work). -> the batch's share of the
    hand-clock time from the first online pass to the last (its packing and steps over theirs and the online
    passes'), the most online passes between two batch steps, the most batch steps between two online steps, and
    the batch lines answered meanwhile."""
    clock = HandClock()
    rig = Rig(long_tokens)
    rig.gate = rig.engine.gate = Gate(slice_ms=3, long_share=0.25, clock=clock)
    rig.pipeline = rig.engine.pipeline = Costed(clock, rig.gate)
    for i in range(400):
        rig.submit(f"b{i}", 40, background=True)
    sent = 0
    lines_answered: list[int] = []  # when the client starts and when its last request is answered

    def next_online(result: object = None) -> None:
        nonlocal sent
        if sent in (0, online_passes):
            lines_answered.append(sum(1 for n in list(rig.answers) if n.startswith("b")))
            if sent:
                return
        sent += 1
        rig.engine.submit(rig.engine.admit(Req(f"o{sent}", 10), next_online, lambda: False))

    next_online()
    until(lambda: len(lines_answered) == 2, "the online client's last request is answered")
    events = list(rig.pipeline.events)
    rig.engine.close(drain=False)
    first = next(i for i, e in enumerate(events) if e[1].startswith("o"))
    last = max(i for i, e in enumerate(events) if e[1].startswith("o"))
    window = [e for e in events[first : last + 1] if e[0] != "admit"]
    cost = {True: 0.0, False: 0.0}  # by online
    online_run, batch_run, most_online, most_batch = 0, 0, 0, 0
    for what, label, i in window:
        online = label.startswith("o")
        cost[online] += STEP_S if what == "step" else ONLINE_PACK_S if online else BATCH_PACK_S
        if what != "step":
            continue
        if online:
            online_run, batch_run = online_run + (i == STEPS - 1), 0
        else:
            online_run, batch_run = 0, batch_run + 1
        most_online, most_batch = max(most_online, online_run), max(most_batch, batch_run)
    share = cost[False] / (cost[False] + cost[True])
    return share, most_online, most_batch, lines_answered[1] - lines_answered[0]


@LANES
def test_a_batch_keeps_its_floor_beside_an_online_client_that_never_stops(long_tokens):
    """Background work's floor counts its host work and the main lanes' whole busy time, not device time alone:
    with online requests whose host work is three times their device work, the batch still gets a quarter of the
    time (counting device time alone it got a tenth, and four online passes between two of its steps)."""
    share, most_online, most_batch, lines = batch_share_beside_a_stream(long_tokens, online_passes=60)
    assert share >= 0.22, share  # the floor, 0.25, less the window's edges
    # an online request's 12 ms owe 3 ms, a slice's worth (all the batch can have in hand): below its floor after
    # one online pass, the batch goes next
    assert most_online <= 1, most_online
    # a floor turn lasts until the batch's balance is back at zero (3 ms owed, 0.75 ms earned per 1 ms step),
    # and then it steps aside at its next pause point: the bound on an online request's wait beside a batch
    assert most_batch <= 4 + 1, most_batch
    assert lines > 0  # its host work (packing, settling) went on too: lines were answered, not only computed
