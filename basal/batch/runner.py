"""Running a batch's lines: through the same decision path as `POST /v1/basal`, as background work, state by state.

Lines are sent in order of their group (model, state, language, facts), a window at a time; the engine admits
background jobs in arrival order, so the lines of one state land in one pass and the prefix tree computes the
state once for all of them. Finished lines are handed to `record` in chunks (one transaction each in the
server's store, one append in `basal run-batch`). A line whose answer says nothing about the line itself
(the server is overloaded or shutting down, or the batch was stopped) is not recorded: it runs again on resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from basal.batch.lines import BadLine, Line, LineAt, error_record, response_record

L = TypeVar("L", bound=Line | LineAt | BadLine)

# (body JSON bytes, cancelled) -> (HTTP status, response body bytes, request id): what POST /v1/basal answers
Decide = Callable[[bytes, Callable[[], bool]], Awaitable[tuple[int, bytes, str]]]
Record = Callable[[list[tuple[int, bool, bytes]]], Awaitable[None]]

NOT_AN_ANSWER = frozenset({499, 503, 529})  # stopped, shutting down, overloaded: the line stays to be run
WINDOW = 256  # lines in the engine at once: enough to fill a pass of max_batch_tokens with demo-sized lines


def in_group_order(lines: Sequence[L]) -> list[L]:
    """Lines (or where they are, `LineAt`) in the order they are sent: the unreadable ones first (their records
    need no engine), then by (group, number), so the lines of one state go together."""
    bad = [b for b in lines if isinstance(b, BadLine)]
    return [*bad, *sorted((x for x in lines if not isinstance(x, BadLine)), key=lambda x: (x.group, x.number))]


async def _each(lines: Sequence[Line | BadLine]) -> AsyncIterator[Line | BadLine]:
    for line in in_group_order(lines):
        yield line


async def run_lines(
    lines: Sequence[Line | BadLine] | AsyncIterable[Line | BadLine],
    decide: Decide,
    record: Record,
    stop: Callable[[], bool] = lambda: False,
    window: int = WINDOW,
) -> None:
    """Run `lines` (those not yet recorded) and hand every finished one to `record`; returns when all are
    recorded or, once `stop()` says so, when the lines already in the engine have stopped. A sequence is sent
    in group order; an async iterable as it yields, one line each time the window has room (so a source that
    claims work claims it only when this server can run it)."""
    source = aiter(lines) if isinstance(lines, AsyncIterable) else _each(lines)
    done: list[tuple[int, bool, bytes]] = []
    wake = asyncio.Event()
    finished = False

    async def writer() -> None:
        while True:
            await wake.wait()
            wake.clear()
            while done:
                chunk = done[:]
                del done[: len(chunk)]
                await record(chunk)
            if finished:
                return

    async def one(line: Line) -> None:
        try:
            status, body, rid = await decide(line.body, stop)
            if status not in NOT_AN_ANSWER:
                done.append((line.number, status == 200, response_record(line.custom_id, status, body, rid)))
                wake.set()
        finally:
            slots.release()

    slots = asyncio.Semaphore(window)
    write = asyncio.create_task(writer())
    tasks = []
    try:
        while True:
            await slots.acquire()  # room first, then the next line: a claiming source claims only with room
            if stop():
                slots.release()
                break
            try:
                line = await anext(source)
            except StopAsyncIteration:
                slots.release()
                break
            if isinstance(line, BadLine):
                slots.release()
                done.append((line.number, False, error_record(line.custom_id, line.code, line.message)))
                wake.set()
                continue
            tasks.append(asyncio.create_task(one(line)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        finished = True
        wake.set()
        if (close := getattr(source, "aclose", None)) is not None:  # an async generator stopped early ends now
            await close()
        await write
