"""How a pass is driven (`advance`, `run_to_end`), and two forwards in flight: the next one is queued on the device
before the last one's result is waited for.

A backend whose device runs asynchronously (the CUDA path) yields `QUEUED` once per pass, at the moment all of the
pass's device work is queued and only its readback is left. `overlapped` runs a forward's forwards in order and,
at that moment, starts the next forward: its host work (the metadata copy, the launches or the graph replay)
happens while the device still computes the previous one, which it then follows in the stream with no gap. Only
then is the previous forward's result waited for. A backend that computes synchronously (the CPUs) never yields
`QUEUED`, and its passes run one after the other exactly as before.

Every other yield is passed on unchanged (the engine's checkpoints), and `overlapped` yields `QUEUED` itself once
only the last forward's readback is left, so a caller can treat all its forwards as one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class Queued:
    """What a pass yields once its device work is all queued (`QUEUED`)."""

    def __repr__(self) -> str:
        return "QUEUED"


QUEUED = Queued()
Pass = Generator[Any, None, T]  # yields None (a checkpoint) or QUEUED, returns the pass's result


def advance(steps: Pass[T]) -> tuple[bool, Any]:
    """One step of a pass: (False, what it yielded) while it runs, (True, its result) once it has ended. The one
    place that reads the generator protocol: every driver of a pass (here, the engine's, the backends') steps
    through it."""
    try:
        return False, next(steps)
    except StopIteration as done:
        return True, done.value


def until_queued(steps: Pass[T]) -> Generator[Any, None, tuple[bool, T | None]]:
    """Drive `steps` until it yields QUEUED (-> (True, None)) or ends (-> (False, its result))."""
    while True:
        ended, step = advance(steps)
        if ended:
            return False, step
        if step is QUEUED:
            return True, None
        yield step


def to_end(steps: Pass[T]) -> Generator[Any, None, T]:
    """The rest of `steps`, every yield passed on as a checkpoint."""
    while True:
        ended, value = advance(steps)
        if ended:
            return value
        yield


def overlapped(passes: Iterable[Pass[T]], collect: Callable[[int, T], None]) -> Generator[Any, None, None]:
    """Run `passes` in order, at most two in flight; `collect(i, result)` gets each one's result."""
    open_passes: list[Pass[T]] = []  # started and not finished: closed if this stops or fails
    in_flight: tuple[int, Pass[T]] | None = None
    try:
        for i, steps in enumerate(passes):
            open_passes.append(steps)
            queued, result = yield from until_queued(steps)
            if in_flight is not None:  # the new pass is queued behind it: now wait for the old one's result
                j, older = in_flight
                collect(j, (yield from to_end(older)))
                open_passes.remove(older)
                in_flight = None
            if queued:
                in_flight = (i, steps)
            else:
                open_passes.remove(steps)
                collect(i, result)
        if in_flight is not None:
            yield QUEUED  # the forward's device work is all queued
            j, last = in_flight
            collect(j, (yield from to_end(last)))
            open_passes.remove(last)
    finally:
        for steps in open_passes:  # stopped or failed mid-way: each pass cleans up (its slot, its pending copies)
            steps.close()


def run_to_end(steps: Pass[T]) -> T:
    """Drive a pass without pausing; its result."""
    while True:
        ended, value = advance(steps)
        if ended:
            return value
