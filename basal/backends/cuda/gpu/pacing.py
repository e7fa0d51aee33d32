"""How far the host may run ahead of the GPU (docs/gpu-path.md §7).

Kernel launches return at once, so an eager pass would queue all its layers in microseconds, and a main-lane
request arriving meanwhile would wait behind every one of them in the stream: the long lane's pause between
layers would pause nothing. `paced` records an event after each layer and does not queue layer i + AHEAD before
layer i has finished: at every pause at most AHEAD layers of the pass are in the stream, and a request that
arrives waits behind no more than those.

Waiting for the device polls its event and sleeps briefly between polls: a lane thread spinning on the GIL would
delay the event loop and the planners by up to the interpreter's switch interval (5 ms) each time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from basal.core.packing.passes import advance

T = TypeVar("T")
LAYERS_AHEAD = 2
POLL_S = 50e-6


def until_done(event: Any) -> Generator[None, None, None]:
    """Yield (a checkpoint: another lane may go) until `event` has completed, sleeping `POLL_S` between polls."""
    while not event.query():
        yield
        time.sleep(POLL_S)


def paced(
    steps: Generator[None, None, T], make_event: Callable[[], Any], ahead: int = LAYERS_AHEAD
) -> Generator[None, None, T]:
    """`steps`, a forward that yields after queueing each layer, with at most `ahead` layers in the stream at
    every yield."""
    queued: deque = deque()  # an event per layer that may still be in the stream
    while True:
        while len(queued) >= ahead:  # the next layer would make ahead + 1
            yield from until_done(queued.popleft())
        ended, value = advance(steps)
        if ended:
            return value
        event = make_event()
        event.record()
        queued.append(event)
        yield
