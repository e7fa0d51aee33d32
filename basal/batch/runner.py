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
Hold = Callable[[Exception], Awaitable[None]]  # a failed record's error -> returns to try again, or raises

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
    hold: Hold | None = None,
) -> None:
    """Run `lines` (those not yet recorded) and hand every finished one to `record`; returns when all are
    recorded or, once `stop()` says so, when the lines already in the engine have stopped. A sequence is sent
    in group order; an async iterable as it yields, one line each time the window has room (so a source that
    claims work claims it only when this server can run it).

    When `record` fails, no new line is sent: with `hold`, the finished lines wait in memory (nothing is computed
    twice) while `hold(error)` waits to try again (or raises to give up), and sending resumes once a write
    succeeds; without it, the error ends the run at once (the lines in the engine are cancelled)."""
    source = aiter(lines) if isinstance(lines, AsyncIterable) else _each(lines)
    done: list[tuple[int, bool, bytes]] = []
    wake = asyncio.Event()
    writable = asyncio.Event()  # clear while `record` fails: no new line is sent
    writable.set()
    finished = False

    async def writer() -> None:
        while True:
            await wake.wait()
            wake.clear()
            while done:
                chunk = done[:]
                try:
                    await record(chunk)
                except Exception as e:
                    writable.clear()
                    if hold is None:
                        raise
                    await hold(e)
                    continue
                del done[: len(chunk)]
                writable.set()
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
    tasks: set[asyncio.Task] = set()  # lines in the engine, and those that failed (their error ends the run)

    def forget(task: asyncio.Task) -> None:
        """A line that finished well left its record in `done`: its task need not be held (a long run keeps none)."""
        if not task.cancelled() and task.exception() is None:
            tasks.discard(task)

    try:
        while True:
            await slots.acquire()  # room first, then the next line: a claiming source claims only with room
            if not writable.is_set():  # records cannot be written: wait until they can, or the writer gives up
                resumed = asyncio.create_task(writable.wait())
                await asyncio.wait((resumed, write), return_when=asyncio.FIRST_COMPLETED)
                resumed.cancel()
            if stop() or write.done():
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
            task = asyncio.create_task(one(line))
            tasks.add(task)
            task.add_done_callback(forget)
        running = set(tasks)
        while running and not write.done():  # the writer giving up ends the run now: its error is the run's
            ended, running = await asyncio.wait({*running, write}, return_when=asyncio.FIRST_COMPLETED)
            running.discard(write)
            for task in ended - {write}:
                task.result()  # a line's own error ends the run, as it did
    finally:
        for task in tasks:
            task.cancel()
        finished = True
        wake.set()
        if (close := getattr(source, "aclose", None)) is not None:  # an async generator stopped early ends now
            await close()
        await write
