"""The embedded store: SQLite (WAL, `synchronous=FULL`, one connection behind one lock) under the store's root.

Layout under the root (by default `$BASAL_HOME/batches`):

    store.sqlite3 (+ -wal, -shm)   files, batches, every finished line's record (`results`), chunk leases
    files/<file id>.jsonl          uploaded inputs and finalized outputs, each written whole or not at all

One server owns the directory: its process is the only writer, and each method is one `BEGIN IMMEDIATE`
transaction, which holds the whole database (so the shared SQL in `basal.batch.sql` needs no row locks here); the
leases a killed process held are given up at open, so a restarted server resumes its batch at once.
The schema's version is SQLite's `user_version`; a store written by an older basal is brought up to date at open.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from basal.batch.sql import SqlStore
from basal.batch.store import WriteFailed, disk_problem

MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    lines INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    fingerprint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    model TEXT,
    status TEXT NOT NULL,
    metadata TEXT,
    output_expires_s INTEGER,
    errors TEXT,
    output_file_id TEXT,
    error_file_id TEXT,
    total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    expires_at INTEGER NOT NULL,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER
);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
""",
    """
CREATE TABLE claims (
    batch_id TEXT NOT NULL,
    chunk INTEGER NOT NULL,
    lines TEXT NOT NULL,
    owner TEXT,
    until REAL,
    done INTEGER NOT NULL,
    PRIMARY KEY (batch_id, chunk)
) WITHOUT ROWID;
CREATE INDEX claims_owner ON claims (owner);
""",
    """
ALTER TABLE files ADD COLUMN owner TEXT;
ALTER TABLE batches ADD COLUMN owner TEXT;
CREATE INDEX files_owner ON files (owner, seq);
CREATE INDEX batches_owner ON batches (owner, seq);
""",
)


class SqliteStore(SqlStore):
    """SQLite metadata and the files directory, for one server. `clock` gives Unix seconds (tests pass a fake)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time):
        super().__init__(root, clock)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.root / "store.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed result survives a power cut, not only a kill
        self._db.execute("PRAGMA busy_timeout=10000")
        self._migrate()
        self._sweep_orphans()
        self._tx(lambda db: db.execute("UPDATE claims SET owner = NULL, until = NULL"))  # the only server: none live

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                for step, sql in enumerate(MIGRATIONS[version:], version + 1):
                    for statement in filter(str.strip, sql.split(";")):
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {step}")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self, fn: Callable[[Any], Any], durable: bool = True) -> Any:
        with self._lock, _disk_errors():
            if not durable:  # WAL without a sync at this commit; the next durable commit syncs it too
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(self._db)
                    self._db.execute("COMMIT")  # a full disk may refuse the commit itself (the WAL grows here)
                except BaseException:
                    if self._db.in_transaction:  # SQLite rolls some failures back itself
                        self._db.execute("ROLLBACK")
                    raise
                return out
            finally:
                if not durable:
                    self._db.execute("PRAGMA synchronous=FULL")

    def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        with self._lock, _disk_errors():
            return self._db.execute(sql, args).fetchall()


REFUSALS = {  # SQLite's primary result codes for a disk that refuses, in words that name no path
    sqlite3.SQLITE_FULL: "no space left on the store's disk",
    sqlite3.SQLITE_READONLY: "the store's database is read-only",
    sqlite3.SQLITE_IOERR: "the store's disk reports an I/O error",
    sqlite3.SQLITE_CANTOPEN: "the store's database files cannot be opened",
}


@contextlib.contextmanager
def _disk_errors() -> Iterator[None]:
    """A full or read-only disk as WriteFailed (the runner pauses, the API answers 507); other errors unchanged."""
    try:
        yield
    except sqlite3.Error as e:
        reason = REFUSALS.get(getattr(e, "sqlite_errorcode", 0) & 0xFF)
        if reason is None:
            raise
        raise WriteFailed(reason) from e
    except OSError as e:
        raise WriteFailed(disk_problem(e)) from e
