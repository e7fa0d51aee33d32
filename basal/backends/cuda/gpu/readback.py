"""Pinned staging slots and async readback (docs/gpu-path.md §7).

Each slot holds a host metadata blob and a host output [R_cap, 16] f32, pinned on CUDA and allocated once. A
forward takes a free slot, copies the blob to the device, runs, copies the logits back without blocking and
records the slot's event; `run()` yields while the event is pending, so the CPU prepares the next forward meanwhile.
A slot is reused only after its own event completed and its result was read (the race vLLM documents).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SLOTS = 3
ONE_OFF = -1  # the index of a slot outside the ring


class DoneEvent:
    """The event of a device that runs synchronously (the CPU, the interpreter)."""

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


@dataclass
class Slot:
    index: int
    blob: Any  # host int32 blob (pinned tensor on CUDA)
    out: Any  # host f32 [R_cap, 16]
    event: Any
    busy: bool = False


@dataclass
class StagingSlots:
    """A ring of slots; `make_buffers(size)` -> (blob, out) host buffers, `make_event()` -> an event."""

    make_buffers: Callable[[int], tuple[Any, Any]]
    make_event: Callable[[], Any] = DoneEvent
    n: int = SLOTS
    blob_size: int = 0
    slots: list[Slot] = field(default_factory=list)

    def acquire(self, blob_size: int) -> Slot:
        """A free slot whose blob holds `blob_size` int32. Never waits: a pass holding a slot may be paused until
        this one finishes (the long lane steps aside for the main lane), so waiting for it could never end. The
        ring grows while no slot is out (never inside a graph); a blob too large for a ring with a slot out, or a
        fourth pass at once, gets a one-off slot of its own."""
        if not self.slots or (blob_size > self.blob_size and not any(s.busy for s in self.slots)):
            self.blob_size = max(blob_size, self.blob_size)
            self.slots = [Slot(i, *self.make_buffers(self.blob_size), self.make_event()) for i in range(self.n)]
        if blob_size <= self.blob_size:
            for s in self.slots:
                if not s.busy:
                    s.busy = True
                    return s
        return Slot(ONE_OFF, *self.make_buffers(blob_size), self.make_event(), busy=True)

    def reserve(self, blob_size: int) -> None:
        """Size the ring for blobs up to `blob_size` now (at start: no forward then grows it or needs a one-off)."""
        self.release(self.acquire(blob_size))

    def release(self, slot: Slot) -> None:
        if not slot.event.query():
            raise RuntimeError("staging slot released before its copy finished")
        slot.busy = False


def numpy_buffers(blob_size: int, readout_cap: int = 1024, letters: int = 16) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(blob_size, dtype=np.int32), np.zeros((readout_cap, letters), dtype=np.float32)
