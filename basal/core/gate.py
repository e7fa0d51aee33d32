"""The device gate: one lane computes at a time; main lanes go first; a long lane yields between layers.

Every lane of every model in the process shares one `Gate`. A main (urgent) lane waits only for the current
holder. A long (preemptible) lane starts only when no main lane waits; while it runs it calls `checkpoint()`
between layers, and once it has held the device for `slice_ms` while a main lane waits, it steps aside for one
main-lane turn and then resumes the same layer with the same tensors — so its results do not change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Gate:
    def __init__(self, slice_ms: float = 100.0):
        self.slice_s = slice_ms / 1000.0
        self._cv = threading.Condition()
        self._held = False
        self._urgent_waiting = 0
        self._owed = False  # a preempted long lane waits to resume after one main-lane turn
        self._turns_since_preempt = 0
        self.preemptions = 0

    @contextmanager
    def hold(self, urgent: bool) -> Iterator[Holder]:
        self._acquire(urgent)
        holder = Holder(self, urgent)
        try:
            yield holder
        finally:
            self._release(urgent)

    def _acquire(self, urgent: bool, resuming: bool = False) -> None:
        with self._cv:
            if urgent:
                self._urgent_waiting += 1
                while self._held or (self._owed and self._turns_since_preempt >= 1):
                    self._cv.wait()
                self._urgent_waiting -= 1
            elif resuming:
                while self._held or (self._turns_since_preempt < 1 and self._urgent_waiting > 0):
                    self._cv.wait()
                self._owed = False
            else:
                while self._held or self._urgent_waiting > 0 or self._owed:
                    self._cv.wait()
            self._held = True

    def _release(self, urgent: bool) -> None:
        with self._cv:
            self._held = False
            if urgent and self._owed:
                self._turns_since_preempt += 1
            self._cv.notify_all()

    def urgent_waiting(self) -> bool:
        with self._cv:
            return self._urgent_waiting > 0


class Holder:
    """What a lane holds while it computes; a long lane calls `checkpoint()` between layers."""

    def __init__(self, gate: Gate, urgent: bool):
        self.gate = gate
        self.urgent = urgent
        self.since = time.perf_counter()

    def checkpoint(self) -> bool:
        """Step aside for one main-lane turn if one waits and this lane has had its slice. True if it yielded."""
        gate = self.gate
        if self.urgent or time.perf_counter() - self.since < gate.slice_s or not gate.urgent_waiting():
            return False
        with gate._cv:
            gate._owed = True
            gate._turns_since_preempt = 0
            gate.preemptions += 1
            gate._held = False
            gate._cv.notify_all()
        gate._acquire(urgent=False, resuming=True)
        self.since = time.perf_counter()
        return True
