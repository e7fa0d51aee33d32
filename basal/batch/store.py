"""The Batch and Files API's store: the interface the API and the runner use, and which database backs it.

Metadata lives in a database (`basal.batch.sqlite`, the embedded default: one server; `basal.batch.postgres`:
several servers sharing one set of batches), file bytes under the store's root on a filesystem
(`files/<file id>.jsonl`, each written whole or not at all; with PostgreSQL, a volume every server mounts).

A finished line is one row of `results`, inserted in the same transaction that counts it in the batch's
`request_counts`, keyed by (batch, line): a line is recorded once whatever crashes, and a record, once committed,
is the very bytes the output file will hold. Files and batches record their `owner` (the digest of the API key
that created them; NULL without keys, and for rows written before owners were stored); a read given an owner
finds only that owner's rows, as if no other existed. The lines of a running batch are split into chunks when it starts;
a server leases one chunk at a time (`claim`), renews its leases while it runs them, and a chunk whose lease ran
out (its server was killed) is claimed again by any server: its lines already recorded are not run again.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # statuses the runner still has work for
TERMINAL = ("completed", "failed", "expired", "cancelled")


class Conflict(Exception):
    """An idempotency key already used for a batch with other data (HTTP 409)."""


class TooMany(Exception):
    """`max_active` batches are not terminal yet (HTTP 429)."""


class StoreError(ValueError):
    """The store cannot be opened as configured (`basal serve` says why and exits 2)."""


class Unavailable(Exception):
    """The database cannot be reached now (HTTP 503; the runner tries again at its next look)."""


class WriteFailed(Exception):
    """The store cannot write now: its disk is full or read-only, or its database refuses writes (HTTP 507; the
    runner pauses and tries again). The message is `reason`: words for the API's users, never a server path."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# what an OSError of the store's disk means, in words that name no path (an OSError's str() names the file)
DISK_WORDS = {
    errno.ENOSPC: "no space left on the store's disk",
    errno.EDQUOT: "the store's disk quota is exceeded",
    errno.EROFS: "the store's disk is read-only",
    errno.EACCES: "the store's files are not writable",
    errno.EPERM: "the store's files are not writable",
    errno.EIO: "the store's disk reports an I/O error",
}


def disk_problem(e: OSError) -> str:
    """Why the store's disk refused, without the path an OSError carries."""
    return DISK_WORDS.get(e.errno or 0) or f"the store's disk refused ({e.strerror or type(e).__name__})"


class Store(Protocol):
    """What the Files and Batches API and the batch runner need of a store (plain values in, dicts out). Each
    method is one transaction; every implementation keeps the same semantics (tests/batch/test_store.py runs
    against each)."""

    root: Path
    files_dir: Path

    def now(self) -> int: ...
    def close(self) -> None: ...

    # files
    def file_path(self, file_id: str) -> Path: ...
    def upload_path(self) -> Path: ...
    def add_file(
        self, tmp: Path, filename: str, purpose: str, expires_after: int | None, lines: int, owner: str | None = None
    ) -> dict: ...
    def get_file(self, file_id: str, owner: str | None = None) -> dict | None: ...
    def list_files(
        self, after: str | None, limit: int, purpose: str | None, owner: str | None = None
    ) -> tuple[list[dict], bool]: ...
    def delete_file(self, file_id: str) -> bool: ...

    # batches
    def create_batch(
        self,
        input_file_id: str,
        endpoint: str,
        window_s: int,
        completion_window: str,
        metadata: dict | None,
        output_expires_s: int | None,
        idempotency_key: str | None,
        max_active: int,
        owner: str | None = None,
    ) -> tuple[dict, bool]: ...
    def get_batch(self, batch_id: str, owner: str | None = None) -> dict | None: ...
    def list_batches(self, after: str | None, limit: int, owner: str | None = None) -> tuple[list[dict], bool]: ...
    def active_batches(self) -> list[dict]: ...
    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = ACTIVE, **fields: Any) -> bool: ...

    def listen(self, on_cancel: Callable[[str], None]) -> None: ...

    # the lines of a running batch: chunks leased to one server at a time
    def start(self, batch_id: str, total: int, chunks: list[list[int]]) -> bool: ...
    def claim(self, batch_id: str, owner: str, lease_s: float) -> tuple[int, list[int]] | None: ...
    def renew(self, owner: str, lease_s: float) -> int: ...
    def settle(self, batch_id: str, chunk: int, owner: str) -> bool: ...
    def release(self, owner: str) -> int: ...

    # results
    def done_lines(self, batch_id: str) -> set[int]: ...
    def add_results(
        self, batch_id: str, records: list[tuple[int, bool, bytes]], done_chunks: tuple[int, ...] = ()
    ) -> int: ...
    def records(self, batch_id: str, ok: bool) -> Iterator[bytes]: ...
    def finalize(
        self, batch_id: str, status: str, default_expires_s: int | None, errors: str | None = None
    ) -> bool: ...

    # retention
    def sweep(self, batch_retention_s: int | None) -> tuple[int, int]: ...


def open_store(root: Path, database: str | None = None, clock: Callable[[], float] = time.time) -> Store:
    """The store `batches.database` names: None (or `sqlite`) for the embedded SQLite file under `root`, a
    `postgresql://` URL for a server database shared by several fronts (whose `root` must then be shared too)."""
    if database is None or database == "sqlite":
        from basal.batch.sqlite import SqliteStore

        return SqliteStore(root, clock)
    if database.startswith(("postgresql://", "postgres://")):
        from basal.batch.postgres import PostgresStore

        return PostgresStore(root, database, clock)
    raise ValueError(f"batches.database must be sqlite or a postgresql:// URL, got {redact(database)!r}")


def redact(url: str) -> str:
    """A database URL without its password, for logs and errors."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    who, _, where = rest.rpartition("@")
    return f"{scheme}://{who.partition(':')[0]}:***@{where}" if ":" in who else url


def new_id(prefix: str) -> str:
    """An opaque id: the prefix an OpenAI-Batch user knows (`file-`, `batch_`), then 128 random bits."""
    return prefix + secrets.token_hex(16)


def write_bytes_atomic(path: Path, parts: Iterable[bytes]) -> int:
    """`path` holds the concatenated parts, synced to disk, or is unchanged (temporary file, fsync, rename).
    -> bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    size = 0
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
                size += len(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size
