"""The device gate: one lane computes at a time; main lanes go first; a long lane yields between layers.

Every lane of every model in the process shares one `Gate`. A main (urgent) lane waits only for the current
holder. A long (preemptible) lane starts only when no main lane waits; while it runs it calls `checkpoint()`
at every pause point, and once it has held the device for `slice_ms` while a main lane waits, it steps aside for
one main-lane turn and then resumes the same layer with the same tensors — so its results do not change.

The long lane's floor (`long_share`, docs/architecture.md): main lanes that never stop arriving would otherwise
keep a long pass from starting, or leave it one slice per main-lane turn. The gate keeps the long lane's balance
in seconds: it earns (1 − share) of every second it holds the device and owes `share` of every second a main lane
holds it while a long lane waits; it banks at most one slice. A long lane in debt does not step aside and goes
before waiting main lanes, so while it has work it gets at least `long_share` of the device time. Only who goes
next changes, never where a pass pauses, so the bits are the same. `long_share` 0 turns the floor off.

Background work (Batch API lines, shadow copies) yields more: its pass steps aside at its very next pause point
once a main lane waits (no slice), and its host work (admitting lines, packing their passes, settling their
answers) waits in `host_turn` while a main lane has work, so it never competes with an online pass for the
interpreter lock or the cores. Both are subject to the floor: background work that has waited out its share goes
on, and main-lane device time while it waits counts against the floor as if it waited for the device.
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
    def __init__(self, slice_ms: float = 100.0, long_share: float = DEFAULT_LONG_SHARE):
        if not 0.0 <= long_share < 1.0:
            raise ValueError(f"long_share must be at least 0 and below 1, got {long_share}")
        self.slice_s = slice_ms / 1000.0
        self.long_share = long_share
        self._cv = threading.Condition()
        self._held = False
        self._held_since = 0.0  # when the holder took the device (a long lane: or last settled its balance)
        self._urgent_waiting = 0
        self._long_waiting = 0
        self._host_waiting = 0  # background host work waiting for main lanes' work to end (`host_turn`)
        self._long_waiting_since = 0.0  # since when some long lane or background work has waited without a break
        self._online = 0  # main lanes with work (queued, packing, on the device or being answered)
        self._owed = False  # a preempted long lane waits to resume after one main-lane turn
        self._turns_since_preempt = 0
        self._balance = self.slice_s  # the long lane's seconds ahead of its floor (< 0: in debt), at most one slice
        self.preemptions = 0
        self.floor_turns = 0  # times a long lane in debt took the device while main lanes waited
        self.long_seconds = 0.0  # device time of long lanes
        self.main_seconds_over_long = 0.0  # device time of main lanes while a long lane waited

    def long_share_seen(self) -> float:
        """Long lanes' device time over itself plus main lanes' time while a long lane waited (1.0 before any)."""
        with self._cv:
            total = self.long_seconds + self.main_seconds_over_long
            return self.long_seconds / total if total else 1.0

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

    def _acquire(self, urgent: bool, resuming: bool = False, before_wait: Callable[[], None] | None = None) -> None:
        with self._cv:
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
                self._start_waiting()
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
            self._held = True
            self._held_since = time.perf_counter()

    def _wait_while(self, blocked: Callable[[], bool], before_wait: Callable[[], None] | None) -> None:
        """Wait while `blocked()` (the caller holds `_cv`); the first time it would wait, run `before_wait` first,
        with the lock released, and look again."""
        while blocked():
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

    def _start_waiting(self) -> None:
        """A long lane or background work starts to wait (caller holds `_cv`)."""
        if not self._long_waiting and not self._host_waiting:
            self._long_waiting_since = time.perf_counter()

    def online(self, busy: bool) -> None:
        """A main lane has work from now on (`busy`), or has none left: background host work waits meanwhile."""
        with self._cv:
            self._online += 1 if busy else -1
            if not self._online:
                self._cv.notify_all()

    def host_turn(self) -> None:
        """Background host work goes on from here once no main lane has work, or once it is below its floor."""
        with self._cv:
            if not self._online or self._in_debt():
                return
            self._start_waiting()
            self._host_waiting += 1
            try:
                while self._online and not self._in_debt():
                    self._cv.wait()
            finally:
                self._host_waiting -= 1

    def _release(self, urgent: bool) -> None:
        with self._cv:
            now = time.perf_counter()
            if urgent:
                if self._long_waiting or self._host_waiting:  # main time while they waited counts against the floor
                    over = now - max(self._held_since, self._long_waiting_since)
                    self._balance -= self.long_share * over
                    self.main_seconds_over_long += over
                if self._owed:
                    self._turns_since_preempt += 1
            else:
                self._settle_long(now)
            self._held = False
            self._cv.notify_all()

    def _settle_long(self, now: float) -> None:
        """Credit the long lane for the device time since `_held_since` (caller holds `_cv`)."""
        self.long_seconds += now - self._held_since
        self._balance = min(self.slice_s, self._balance + (1.0 - self.long_share) * (now - self._held_since))
        self._held_since = now

    def urgent_waiting(self) -> bool:
        with self._cv:
            return self._urgent_waiting > 0

    def host_waiting(self) -> int:
        """Background host work waiting in `host_turn` now."""
        with self._cv:
            return self._host_waiting


class Holder:
    """What a lane holds while it computes; a long lane calls `checkpoint()` at every pause point."""

    def __init__(self, gate: Gate, urgent: bool, slice_s: float | None = None):
        self.gate = gate
        self.urgent = urgent
        self.slice_s = gate.slice_s if slice_s is None else slice_s  # 0: a background pass, no slice
        self.since = time.perf_counter()

    def checkpoint(self) -> bool:
        """Step aside for one main-lane turn if one waits, this lane has had its slice and it is not below its
        floor. True if it yielded."""
        gate = self.gate
        if self.urgent or time.perf_counter() - self.since < self.slice_s or not gate.urgent_waiting():
            return False
        with gate._cv:
            gate._settle_long(time.perf_counter())
            if gate._in_debt():  # below its floor: keep the device until the balance is back at zero
                return False
            gate._owed = True
            gate._turns_since_preempt = 0
            gate.preemptions += 1
            gate._held = False
            gate._cv.notify_all()
        gate._acquire(urgent=False, resuming=True)
        self.since = time.perf_counter()
        return True
