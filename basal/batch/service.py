"""The server's batch work: one background task that validates, runs, finalizes, expires and sweeps batches.

Everything it knows is in the store, so a process killed at any point picks up where the store says: a batch in
`validating` is validated again, one `in_progress` runs the lines not yet recorded, one `finalizing` or
`cancelling` is finalized. One batch runs at a time here (its lines fill the engine's background lane; a second
batch would only queue behind it). Its lines are leased a chunk at a time (`Store.claim`), so several servers on
one shared store run one batch together, and a killed server's chunks go to another once their lease lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from basal.batch.fault import StoreFault, StoreSeries
from basal.batch.lines import InputFile
from basal.batch.runner import WINDOW, Decide, in_group_order, run_lines
from basal.batch.store import Store, Unavailable, WriteFailed

log = logging.getLogger(__name__)

WINDOW_S = {"24h": 24 * 3600}  # the completion windows the API accepts
POLL_S = 1.0  # how often the task looks for expired files and batches when nothing wakes it
STATUS_POLL_S = 0.1  # how often a server running a batch's lines reads its status (a cancel on another front)
T = TypeVar("T")
CHUNK_LINES = 128  # lines per lease (at most half the window): few store calls per line, a few chunks held


@dataclass(frozen=True)
class BatchSettings:
    """The limits of the Batch and Files API (docs/batches.md); built from `batches:` in the configuration."""

    root: Path
    max_upload_bytes: int = 200_000_000
    max_lines: int = 50_000
    max_line_bytes: int = 1 << 20
    max_active: int = 8  # batches not yet terminal; one more is refused with 429
    output_retention_s: int | None = 30 * 86400  # output and error files (unless the batch says otherwise)
    batch_retention_s: int | None = 30 * 86400  # terminal batches and their records
    window: int = WINDOW
    database: str | None = None  # None: SQLite under `root`; a postgresql:// URL: shared by several servers
    lease_s: float = 30.0  # a claimed chunk's lease, renewed while it runs; a killed server's lapses after this


class BatchService:
    """The store, the limits, and the task that does the batches' work on the server's event loop."""

    def __init__(self, store: Store, settings: BatchSettings):
        self.store, self.settings = store, settings
        self.decide: Callable[[str | None], Decide] | None = None  # a batch owner -> the path its lines take
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"  # whose leases are whose
        self._wake = asyncio.Event()
        self._cancel: set[str] = set()
        self._running: str | None = None  # the batch whose lines are in the engine now
        self._inputs: dict[str, InputFile] = {}  # the running batch's input file, indexed (an input never changes)
        self._started: set[str] = set()  # batches this server saw in progress, their chunks planned
        self._closed = False
        self._task: asyncio.Task | None = None
        self.fault = StoreFault("sqlite" if settings.database in (None, "sqlite") else "postgresql")

    def attach(self, decide: Callable[[str | None], Decide], metrics: StoreSeries | None = None) -> None:
        """The decision path lines go through, per batch owner (`basal.api.decide.body_decider` with that owner:
        a batch's lines run in its key's cache scope), set when the app is built, and the server's metrics (the
        store's state)."""
        self.decide = decide
        if metrics is not None:
            self.fault.observe(metrics)

    async def start(self) -> None:
        self._wake = asyncio.Event()  # bound to the server's loop
        loop = asyncio.get_running_loop()

        def cancelled_elsewhere(batch_id: str) -> None:  # on the store's listening thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
                loop.call_soon_threadsafe(self._cancel.add, batch_id)

        self.store.listen(cancelled_elsewhere)
        self._task = asyncio.create_task(self._loop(), name="basal-batches")

    async def stop(self) -> None:
        """Stop at once: lines in the engine stop, and run again at the next start (or on another server, which
        finds this server's leases given up)."""
        self._closed = True
        self._wake.set()
        self.fault.nudge()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 30)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        with contextlib.suppress(Unavailable, WriteFailed):
            await asyncio.to_thread(self.store.release, self.owner)
        self._drop_inputs(set())
        self.store.close()

    def wake(self) -> None:
        self._wake.set()

    async def cancel(self, batch_id: str) -> None:
        """The batch was set `cancelling`: if it runs here, its lines stop at their next checkpoint and the runner
        finalizes it; otherwise it is finalized here at once (another server running its lines sees it end
        at once, through the store's `listen`, or within STATUS_POLL_S, and stops them; what they finish after
        the batch ended is not recorded)."""
        self._cancel.add(batch_id)  # kept: a stale look at the batch can never run its lines again
        self.fault.nudge()  # its lines may wait for the store: they stop waiting
        if self._running != batch_id:
            await self._finalize(batch_id, "cancelled")
        self._wake.set()

    async def _loop(self) -> None:
        while not self._closed:
            wait_s = POLL_S
            try:
                await asyncio.to_thread(self.store.release, self.owner)  # leases of a run that an error ended
                await asyncio.to_thread(self.store.sweep, self.settings.batch_retention_s)
                active = await asyncio.to_thread(self.store.active_batches)
                self._started &= {b["id"] for b in active}
                self._drop_inputs({b["id"] for b in active})
                for batch in active:
                    if self._closed:
                        break
                    await self._advance(batch)
                if self.fault.reason is not None and not self._closed:  # every write went through: the disk too?
                    await asyncio.to_thread(self.fault.probe, self.store.files_dir)
                    self.fault.healed()
            except (WriteFailed, Unavailable) as e:  # a full disk, a database away: paused, tried again later
                wait_s = self.fault.failed(e)
            except Exception:  # a bug: said, and tried again at the next wake
                log.exception("batch work failed")
            if self._closed:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
            self._wake.clear()

    def _expired(self, batch: dict) -> bool:
        return self.store.now() >= batch["expires_at"]

    async def _advance(self, listed: dict) -> None:
        self._running = listed["id"]  # from here on, a cancel of this batch is the runner's to finish
        try:
            await self._advance_one(listed["id"])
        finally:
            self._running = None

    async def _advance_one(self, batch_id: str) -> None:
        store = self.store
        batch = await asyncio.to_thread(store.get_batch, batch_id)  # as it is now, not as it was listed
        if batch is None:
            return
        status = batch["status"]
        if status in ("validating", "in_progress") and self._expired(batch):
            await self._finalize(batch_id, "expired")
            return
        if status == "cancelling":
            await self._finalize(batch_id, "cancelled")
            return
        if status == "finalizing":
            await self._finalize(batch_id, "completed")
            return
        source = self._inputs.get(batch_id)
        if source is None:
            source = await asyncio.to_thread(self._read_lines, batch)
            if source is None:
                return
            self._drop_inputs(set())
            self._inputs = {batch_id: source}
        if batch_id not in self._started:  # the first server here splits the lines into chunks; the plan stands
            size = max(1, min(CHUNK_LINES, self.settings.window // 2))
            order = [line.number for line in in_group_order(source.lines)]
            chunks = [order[i : i + size] for i in range(0, len(order), size)]
            if not await asyncio.to_thread(store.start, batch_id, len(source.lines), chunks):
                return
            self._started.add(batch_id)
        await self._run(batch, source)
        if self._closed:
            return
        if batch_id in self._cancel:
            await self._finalize(batch_id, "cancelled")
        elif self._expired(batch):
            await self._finalize(batch_id, "expired")
        else:
            now = await asyncio.to_thread(store.get_batch, batch_id)
            if (
                now is not None
                and now["status"] == "in_progress"
                and now["completed"] + now["failed"] >= now["total"]
                and await asyncio.to_thread(store.set_status, batch_id, "finalizing", ("in_progress",))
            ):
                await self._finalize(batch_id, "completed")

    async def _run(self, batch: dict, source: InputFile) -> None:
        """Run the chunks of `batch` this server can claim, one claimed each time the engine's window has room,
        until none is left to claim (the rest done, or leased by live servers) or the batch stops. A chunk's lines
        are read from the input file when it is claimed."""
        store, batch_id, lease_s = self.store, batch["id"], self.settings.lease_s
        by_number = {line.number: line for line in source.lines}
        pending: dict[int, set[int]] = {}  # chunk -> its lines not recorded yet
        chunk_of: dict[int, int] = {}
        ended = False  # the batch left `in_progress` on another server (cancelled, finalized)

        def stop() -> bool:
            return self._closed or ended or batch_id in self._cancel or self._expired(batch)

        async def hold(e: Exception) -> None:
            """A write the store refused: wait and try again (the finished lines wait in memory), unless the
            batch stops meanwhile (what was not written runs again)."""
            if not isinstance(e, (WriteFailed, Unavailable)) or stop():
                raise e
            await self.fault.wait(self.fault.failed(e, batch_id))
            if stop():
                raise e

        async def call(fn: Callable[..., T], *args: object) -> T:
            """A store call of the run, tried again (after `hold`'s wait) while the store refuses."""
            while True:
                try:
                    return await asyncio.to_thread(fn, *args)
                except (WriteFailed, Unavailable) as e:
                    await hold(e)

        async def claimed() -> AsyncIterator:
            while not stop():
                got = await call(store.claim, batch_id, self.owner, lease_s)
                if got is None:
                    return
                chunk, todo = got
                if not todo:
                    await call(store.settle, batch_id, chunk, self.owner)
                    continue
                pending[chunk] = set(todo)
                chunk_of.update(dict.fromkeys(todo, chunk))
                for line in await asyncio.to_thread(source.read, in_group_order([by_number[n] for n in todo])):
                    yield line

        async def record(chunk: list[tuple[int, bool, bytes]]) -> None:
            numbers = {number for number, _, _ in chunk}
            finished = tuple(c for c, todo in pending.items() if todo <= numbers)  # done in the same transaction
            await asyncio.to_thread(store.add_results, batch_id, chunk, finished)
            if self.fault.reason is not None:
                self.fault.healed()
            for number in numbers:  # once written: a refused write is tried again with the same chunks
                c = chunk_of.pop(number, None)
                if c is not None and c in pending:
                    pending[c].discard(number)
                    if not pending[c]:
                        del pending[c]

        async def watch() -> None:
            """The batch's status seen within STATUS_POLL_S (a cancel on another front), leases renewed."""
            nonlocal ended
            renew_at = time.monotonic() + lease_s / 3
            while True:
                await asyncio.sleep(STATUS_POLL_S)
                try:
                    row = await asyncio.to_thread(store.get_batch, batch_id)
                    if row is None or row["status"] != "in_progress":
                        ended = True
                        if row is not None and row["status"] == "cancelling":
                            self._cancel.add(batch_id)
                    if time.monotonic() >= renew_at:
                        renew_at = time.monotonic() + lease_s / 3  # a refused renewal is tried at the next turn
                        await asyncio.to_thread(store.renew, self.owner, lease_s)
                except (Unavailable, WriteFailed) as e:
                    if self.fault.reason is None:  # a pause says it once
                        log.warning("batch %s: cannot renew leases or see its status: %s", batch_id, e)

        assert self.decide is not None, "BatchService.attach was not called"
        watcher = asyncio.create_task(watch())
        try:
            await run_lines(claimed(), self.decide(batch["owner"]), record, stop, self.settings.window, hold)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(Unavailable, WriteFailed):
                for chunk in list(pending):  # lines not recorded (stopped, overloaded): claimable again at once
                    await asyncio.to_thread(store.settle, batch_id, chunk, self.owner)

    def _read_lines(self, batch: dict) -> InputFile | None:
        """The input file, open and indexed, or None after failing the batch (its input file is gone or
        unreadable), which keeps what it recorded (an output and an error file, as a batch that ends otherwise)."""
        path = self.store.file_path(batch["input_file_id"])
        try:
            return InputFile(path, self.settings.max_line_bytes)
        except (OSError, ValueError) as e:
            message = str(e) if isinstance(e, ValueError) else input_file_problem(batch["input_file_id"], e)
            errors = {
                "object": "list",
                "data": [{"code": "invalid_input_file", "message": message, "param": "input_file_id", "line": None}],
            }
            self.store.finalize(batch["id"], "failed", self.settings.output_retention_s, json.dumps(errors))
            return None

    def _drop_inputs(self, keep: set[str]) -> None:
        """Close the input files of batches other than `keep` (ended, or another runs now)."""
        for batch_id in [b for b in self._inputs if b not in keep]:
            self._inputs.pop(batch_id).close()

    async def _finalize(self, batch_id: str, status: str) -> None:
        moved = await asyncio.to_thread(self.store.finalize, batch_id, status, self.settings.output_retention_s)
        if moved and self.fault.reason is not None:  # its files and its row were written: the store writes again
            self.fault.healed()


def input_file_problem(file_id: str, e: OSError) -> str:
    """Why a batch's input file cannot be read, in words that name the file by its id, never by the store's path
    on this server (the API's users are not its operators)."""
    if isinstance(e, FileNotFoundError):
        return f"the input file {file_id} is gone (deleted while the batch waited or ran)"
    return f"the input file {file_id} cannot be read on the server ({e.strerror or type(e).__name__})"
