"""The server's batch work: one background task that validates, runs, finalizes, expires and sweeps batches.

Everything it knows is in the store, so a process killed at any point picks up where the store says: a batch in
`validating` is validated again, one `in_progress` runs the lines not yet recorded, one `finalizing` or
`cancelling` is finalized. One batch runs at a time (its lines fill the engine's background lane; a second batch
would only queue behind it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from basal.batch.lines import check_upload
from basal.batch.runner import WINDOW, Decide, run_lines
from basal.batch.store import Store

log = logging.getLogger(__name__)

WINDOW_S = {"24h": 24 * 3600}  # the completion windows the API accepts
POLL_S = 1.0  # how often the task looks for expired files and batches when nothing wakes it


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


class BatchService:
    """The store, the limits, and the task that does the batches' work on the server's event loop."""

    def __init__(self, store: Store, settings: BatchSettings):
        self.store, self.settings = store, settings
        self.decide: Decide | None = None
        self._wake = asyncio.Event()
        self._cancel: set[str] = set()
        self._running: str | None = None  # the batch whose lines are in the engine now
        self._closed = False
        self._task: asyncio.Task | None = None

    def attach(self, decide: Decide) -> None:
        """The decision path lines go through (`basal.api.decide.body_decider`), set when the app is built."""
        self.decide = decide

    async def start(self) -> None:
        self._wake = asyncio.Event()  # bound to the server's loop
        self._task = asyncio.create_task(self._loop(), name="basal-batches")

    async def stop(self) -> None:
        """Stop at once: lines in the engine stop, and run again at the next start."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 30)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        self.store.close()

    def wake(self) -> None:
        self._wake.set()

    async def cancel(self, batch_id: str) -> None:
        """The batch was set `cancelling`: if it runs, its lines stop at their next checkpoint and the runner
        finalizes it; if it waits behind another batch, it is finalized here at once."""
        self._cancel.add(batch_id)  # kept: a stale look at the batch can never run its lines again
        if self._running != batch_id:
            await self._finalize(batch_id, "cancelled")
        self._wake.set()

    async def _loop(self) -> None:
        while not self._closed:
            try:
                await asyncio.to_thread(self.store.sweep, self.settings.batch_retention_s)
                for batch in await asyncio.to_thread(self.store.active_batches):
                    if self._closed:
                        break
                    await self._advance(batch)
            except Exception:  # a bug or a full disk: said, and tried again at the next wake
                log.exception("batch work failed")
            if self._closed:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
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
        lines = await asyncio.to_thread(self._read_lines, batch)
        if lines is None:
            return
        if status == "validating":
            moved = await asyncio.to_thread(
                store.set_status, batch_id, "in_progress", ("validating",), total=len(lines)
            )
            if not moved:
                return
        done = await asyncio.to_thread(store.done_lines, batch_id)
        todo = [line for line in lines if line.number not in done]
        if todo:
            assert self.decide is not None, "BatchService.attach was not called"

            def stop() -> bool:
                return self._closed or batch_id in self._cancel or self._expired(batch)

            async def record(chunk: list[tuple[int, bool, bytes]]) -> None:
                await asyncio.to_thread(store.add_results, batch_id, chunk)

            await run_lines(todo, self.decide, record, stop, self.settings.window)
        if self._closed:
            return
        if batch_id in self._cancel:
            await self._finalize(batch_id, "cancelled")
        elif self._expired(batch):
            await self._finalize(batch_id, "expired")
        elif len(await asyncio.to_thread(store.done_lines, batch_id)) == len(lines) and await asyncio.to_thread(
            store.set_status, batch_id, "finalizing", ("in_progress",)
        ):
            await self._finalize(batch_id, "completed")

    def _read_lines(self, batch: dict) -> list | None:
        """The input file's lines, or None after failing the batch (its input file is gone or unreadable)."""
        path = self.store.file_path(batch["input_file_id"])
        try:
            data = path.read_bytes()
            return check_upload(data, 1 << 62, self.settings.max_line_bytes)
        except (OSError, ValueError) as e:
            message = str(e) if isinstance(e, ValueError) else input_file_problem(batch["input_file_id"], e)
            errors = {
                "object": "list",
                "data": [{"code": "invalid_input_file", "message": message, "param": "input_file_id", "line": None}],
            }
            self.store.set_status(batch["id"], "failed", ("validating", "in_progress"), errors=json.dumps(errors))
            return None

    async def _finalize(self, batch_id: str, status: str) -> None:
        await asyncio.to_thread(self.store.finalize, batch_id, status, self.settings.output_retention_s)


def input_file_problem(file_id: str, e: OSError) -> str:
    """Why a batch's input file cannot be read, in words that name the file by its id, never by the store's path
    on this server (the API's users are not its operators)."""
    if isinstance(e, FileNotFoundError):
        return f"the input file {file_id} is gone (deleted while the batch waited or ran)"
    return f"the input file {file_id} cannot be read on the server ({e.strerror or type(e).__name__})"


def lines_of(data: bytes, settings: BatchSettings) -> list:
    """An upload's parsed lines under the settings' limits (UploadRefused otherwise)."""
    return check_upload(data, settings.max_lines, settings.max_line_bytes)
