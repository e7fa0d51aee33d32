"""Whether the batch store can write now: what the runner found, and what `/health/ready`, `/metrics` and an active
batch's `errors` say while it cannot.

A write the store refuses (`WriteFailed`: a full or read-only disk, a database that refuses writes; `Unavailable`:
the database cannot be reached) pauses batch work rather than failing it: the runner keeps the lines it finished in
memory, sends no new line, and tries again after a wait that doubles from RETRY_MIN_S to RETRY_MAX_S; the first
write that succeeds ends the pause. Online decisions need no store and go on being served. One warning is logged
when a pause starts and one line when it ends, not a traceback per try.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

from basal.batch.store import Unavailable, WriteFailed, disk_problem, write_bytes_atomic

log = logging.getLogger("basal.batch.service")

RETRY_MIN_S = 0.5  # the first wait after a refused write
RETRY_MAX_S = 30.0  # the longest wait between two tries
UNREACHABLE = "the batch store's database cannot be reached"


def reason_of(e: WriteFailed | Unavailable) -> str:
    """Words for an operator and an API user: a WriteFailed's own (they name no path), fixed words for a database
    that cannot be reached (its error names the server's address)."""
    return e.reason if isinstance(e, WriteFailed) else UNREACHABLE


class StoreSeries(Protocol):
    """The server's series this reports to (`basal.core.engine.metrics.Metrics` has them; `batch/` imports nothing
    of the engine)."""

    batches_store_writable: Any  # a gauge by store: set(store, value=)
    batches_store_write_failures: Any  # a counter by store: inc(store)
    batches_paused: Any  # a gauge by store


class StoreFault:
    """The store's state as the batch work found it (one per BatchService; read by the API on the same loop)."""

    def __init__(self, kind: str):
        self.kind = kind  # "sqlite" or "postgresql": the label of the metrics
        self.reason: str | None = None  # why the store cannot write now; None: it can
        self.since = 0.0  # monotonic time the pause began
        self.failures = 0  # refused writes, ever (the counter in /metrics)
        self.tries = 0  # refused writes since the last that succeeded: the next wait
        self.paused: str | None = None  # the batch whose finished lines wait for the store
        self._metrics: StoreSeries | None = None
        self._nudge: asyncio.Event | None = None

    def observe(self, metrics: StoreSeries) -> None:
        """Report to these metrics (the server's), from now on."""
        self._metrics = metrics
        metrics.batches_store_writable.set(self.kind, value=1.0 if self.reason is None else 0.0)
        metrics.batches_store_write_failures.inc(self.kind, by=0)
        metrics.batches_paused.set(self.kind, value=0.0)

    def failed(self, e: WriteFailed | Unavailable, batch_id: str | None = None) -> float:
        """A write was refused: the pause starts (said once) or goes on. -> seconds to wait before trying again."""
        reason = reason_of(e)
        if self.reason is None:
            self.since = time.monotonic()
            log.warning(
                "batch work paused: %s; it resumes by itself once the store can write again (tried again after"
                " %.1f s, then up to every %.0f s)",
                reason,
                RETRY_MIN_S,
                RETRY_MAX_S,
            )
        self.reason = reason
        self.failures += 1
        self.tries += 1
        if batch_id is not None:
            self.paused = batch_id
        if self._metrics is not None:
            self._metrics.batches_store_write_failures.inc(self.kind)
        self._report()
        return min(RETRY_MAX_S, RETRY_MIN_S * 2 ** (self.tries - 1))

    def healed(self) -> None:
        """A write succeeded: the pause, if any, ends."""
        if self.reason is not None:
            log.info("the batch store writes again: batch work resumes after %.1f s", time.monotonic() - self.since)
        self.reason, self.tries, self.paused = None, 0, None
        self._report()

    def probe(self, files_dir: Path) -> None:
        """After a pause, whether the files' disk takes a small write (the database's is tried by the work itself)."""
        probe = files_dir / f".probe-{secrets.token_hex(4)}.tmp"
        try:
            write_bytes_atomic(probe, [b"basal"])
            probe.unlink()
        except OSError as e:
            with contextlib.suppress(OSError):
                probe.unlink(missing_ok=True)
            raise WriteFailed(disk_problem(e)) from e

    async def wait(self, seconds: float) -> None:
        """Sleep until the next try, or until `nudge` (the server stops, a batch is cancelled)."""
        if self._nudge is None:
            self._nudge = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._nudge.wait(), seconds)
        self._nudge.clear()

    def nudge(self) -> None:
        if self._nudge is not None:
            self._nudge.set()

    def batch_errors(self, errors: str | None) -> str | None:
        """An active batch's `errors` while its work is paused (its own, if it has any: they say more)."""
        if self.reason is None or errors:
            return errors
        message = f"batch work is paused: {self.reason}; it resumes by itself once the store can write again"
        return json.dumps(
            {"object": "list", "data": [{"code": "store_unwritable", "message": message, "param": None, "line": None}]}
        )

    def _report(self) -> None:
        if self._metrics is not None:
            self._metrics.batches_store_writable.set(self.kind, value=1.0 if self.reason is None else 0.0)
            self._metrics.batches_paused.set(self.kind, value=1.0 if self.paused is not None else 0.0)
