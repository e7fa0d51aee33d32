"""The device gate: one lane computes at a time; main lanes go first; a long lane yields between layers.

Every lane of every model in the process shares one `Gate`. A main (urgent) lane waits only for the current
holder. A long (preemptible) lane starts only when no main lane waits; while it runs it calls `checkpoint()`
at every pause point, and once it has held the device for `slice_ms` while a main lane waits, it steps aside for
one main-lane turn and then resumes the same layer with the same tensors — so its results do not change.

The long lane's floor (`long_share`, docs/architecture.md): main lanes that never stop arriving would otherwise
keep a long pass from starting, or leave it one slice per main-lane turn. The gate keeps the long lane's balance
in seconds: it earns (1 − share) of every second it holds the device and owes `share` of every second it waits
while a main lane has work; it banks at most one slice. A long lane in debt does not step aside and goes
before waiting main lanes, so while it has work it gets at least `long_share` of the time. Only who goes
next changes, never where a pass pauses, so the bits are the same. `long_share` 0 turns the floor off.

Background work (Batch API lines, shadow copies) yields more: its pass steps aside at its very next pause point
once a main lane waits (no slice), and its host work (admitting lines, packing their passes, settling their
answers) waits in `host_work` while a main lane has work (queued, packing, on the device or being answered), so
it does not compete with an online pass for the interpreter lock or the cores. Both are under the floor, on one
balance: host work earns as device time does, and a main lane's whole busy time — its host work too — counts
against the floor while background work waits, so passes and host work together get `long_share` of the time
even when online requests spend most of theirs off the device. Below its floor, host work goes on beside online
work, and its pass keeps the device until its balance is back at zero (a floor turn: at most
share / (1 − share) of the main-lane time it owed, then one pause point).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)
DEFAULT_LONG_SHARE = 0.25  # docs/configuration.md "Limits": the long lane's floor on the device time while it has work


class Gate:
    def __init__(
        self,
        slice_ms: float = 100.0,
        long_share: float = DEFAULT_LONG_SHARE,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """`clock`: seconds, for slices and the floor's balance (a test drives it by hand)."""
        if not 0.0 <= long_share < 1.0:
            raise ValueError(f"long_share must be at least 0 and below 1, got {long_share}")
        self.slice_s = slice_ms / 1000.0
        self.long_share = long_share
        self._cv = threading.Condition()
        self.clock = clock
        self._held = False
        self._held_urgent = False  # the holder is a main lane
        self._urgent_waiting = 0
        self._long_waiting = 0
        self._host_waiting = 0  # background host work waiting for main lanes' work to end (`host_work`)
        self._host_active = 0  # background host work running now (`host_work` sections)
        self._online = 0  # main lanes with work (queued, packing, on the device or being answered)
        self._owed = False  # a preempted long lane waits to resume after one main-lane turn
        self._turns_since_preempt = 0
        self._balance = self.slice_s  # the long lane's seconds ahead of its floor (< 0: in debt), at most one slice
        self._clock = clock()  # the balance is settled up to here (`_charge`)
        self.preemptions = 0
        self.floor_turns = 0  # times a long lane in debt took the device while main lanes waited
        self.long_seconds = 0.0  # device time of long lanes
        self.host_seconds = 0.0  # wall time with background host work running and no long lane on the device
        self.main_seconds_over_long = 0.0  # main lanes' busy time while a long lane or background host work waited

    def long_share_seen(self) -> float:
        """Long lanes' and background host work's time over itself plus main lanes' busy time while they waited
        (1.0 before any)."""
        with self._cv:
            self._charge(self.clock())
            mine = self.long_seconds + self.host_seconds
            total = mine + self.main_seconds_over_long
            return mine / total if total else 1.0

    @contextmanager
    def hold(
        self, urgent: bool, before_wait: Callable[[], None] | None = None, background: bool = False
    ) -> Iterator[Holder]:
        """Hold the device. `before_wait` runs (without the gate's lock) if the device is not free at once: a lane
        finishes its last pass there rather than keep its answers waiting behind another lane's turn.
        `background`: a pass of background work, which steps aside at its next pause point once a main lane waits."""
        self._acquire(urgent, before_wait=before_wait)
        holder = Holder(self, urgent, 0.0 if background else self.slice_s)
        try:
            yield holder
        finally:
            self._release(urgent)

    def _in_debt(self) -> bool:
        return self._balance < 0.0

    def _charge(self, now: float) -> None:
        """Settle the long lane's balance for the time since the last settling (the caller holds `_cv`, and calls
        this before every change of who holds, waits or works). A long lane on the device or background host work
        running earns (1 − share) of that time; a long lane or host work waiting while a main lane has work (or
        holds the device) owes `share` of it. Nothing changes in between, so the time is all of one kind."""
        elapsed, self._clock = now - self._clock, now
        if elapsed <= 0.0:
            return
        device = self._held and not self._held_urgent
        if device or self._host_active:
            if device:
                self.long_seconds += elapsed
            else:
                self.host_seconds += elapsed
            self._balance = min(self.slice_s, self._balance + (1.0 - self.long_share) * elapsed)
        elif (self._long_waiting or self._host_waiting) and (
            (self._held and self._held_urgent) or (self._online and not (self._urgent_waiting and not self._held))
        ):  # not while the device is free and a main lane on its way to it: the hand-over is nobody's time
            self.main_seconds_over_long += elapsed
            self._balance -= self.long_share * elapsed

    def _acquire(self, urgent: bool, resuming: bool = False, before_wait: Callable[[], None] | None = None) -> None:
        with self._cv:
            self._charge(self.clock())
            if urgent:
                self._urgent_waiting += 1
                self._wait_while(
                    lambda: (
                        self._held
                        or (self._owed and self._turns_since_preempt >= 1)
                        or (self._long_waiting and self._in_debt())
                    ),
                    before_wait,
                )
                self._urgent_waiting -= 1
            else:
                self._long_waiting += 1
                if resuming:
                    self._wait_while(
                        lambda: (
                            self._held
                            or (self._turns_since_preempt < 1 and self._urgent_waiting > 0 and not self._in_debt())
                        ),
                        before_wait,
                    )
                    self._owed = False
                else:
                    self._wait_while(
                        lambda: self._held or self._owed or (self._urgent_waiting > 0 and not self._in_debt()),
                        before_wait,
                    )
                if self._urgent_waiting > 0 and self._in_debt():
                    self.floor_turns += 1
                self._long_waiting -= 1
            self._held, self._held_urgent = True, urgent

    def _wait_while(self, blocked: Callable[[], bool], before_wait: Callable[[], None] | None) -> None:
        """Wait while `blocked()` (the caller holds `_cv`; the balance is settled before each look); the first time
        it would wait, run `before_wait` first, with the lock released, and look again."""
        while True:
            self._charge(self.clock())
            if not blocked():
                return
            if before_wait is None:
                self._cv.wait()
                continue
            run, before_wait = before_wait, None
            self._cv.release()
            try:
                run()
            except Exception:  # its own failures are its own: the lane waiting here must still get the device
                log.exception("work done while waiting for the device failed")
            finally:
                self._cv.acquire()

    def online(self, busy: bool) -> None:
        """A main lane has work from now on (`busy`), or has none left: background host work waits meanwhile."""
        with self._cv:
            self._charge(self.clock())
            self._online += 1 if busy else -1
            self._cv.notify_all()  # waiting host work looks again: at its floor's time, or free now

    @contextmanager
    def host_work(self) -> Iterator[None]:
        """A section of background host work (admitting a line, packing a pass, settling an answer): it starts once
        no main lane has work, or once the long lane is below its floor, and its time counts toward that floor as
        a long lane's device time does, so host work and passes together get `long_share` of the time."""
        with self._cv:
            self._charge(self.clock())
            if self._online and not self._in_debt():
                self._host_waiting += 1
                try:
                    while self._online and not self._in_debt():
                        # owing `share` of each second from now, it is below its floor after balance / share
                        self._cv.wait(self._balance / self.long_share + 1e-4 if self.long_share else None)
                        self._charge(self.clock())
                finally:
                    self._host_waiting -= 1
            self._host_active += 1
        try:
            yield
        finally:
            with self._cv:
                self._charge(self.clock())
                self._host_active -= 1
                self._cv.notify_all()

    def _release(self, urgent: bool) -> None:
        with self._cv:
            self._charge(self.clock())
            if urgent and self._owed:
                self._turns_since_preempt += 1
            self._held = self._held_urgent = False
            self._cv.notify_all()

    def tick(self) -> None:
        """The clock moved with nothing else changing (a hand-driven clock): waiting host work looks again."""
        with self._cv:
            self._charge(self.clock())
            self._cv.notify_all()

    def urgent_waiting(self) -> bool:
        with self._cv:
            return self._urgent_waiting > 0

    def host_waiting(self) -> int:
        """Background host work waiting in `host_work` now."""
        with self._cv:
            return self._host_waiting


class Holder:
    """What a lane holds while it computes; a long lane calls `checkpoint()` at every pause point."""

    def __init__(self, gate: Gate, urgent: bool, slice_s: float | None = None):
        self.gate = gate
        self.urgent = urgent
        self.slice_s = gate.slice_s if slice_s is None else slice_s  # 0: a background pass, no slice
        self.since = gate.clock()

    def checkpoint(self) -> bool:
        """Step aside for one main-lane turn if one waits, this lane has had its slice and it is not below its
        floor. True if it yielded."""
        gate = self.gate
        if self.urgent or gate.clock() - self.since < self.slice_s or not gate.urgent_waiting():
            return False
        with gate._cv:
            gate._charge(gate.clock())
            if gate._in_debt():  # below its floor: keep the device until the balance is back at zero
                return False
            gate._owed = True
            gate._turns_since_preempt = 0
            gate.preemptions += 1
            gate._held = gate._held_urgent = False
            gate._cv.notify_all()
        gate._acquire(urgent=False, resuming=True)
        self.since = gate.clock()
        return True
