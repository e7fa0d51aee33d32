"""The Batch and Files API's store: metadata in SQLite (WAL, one writer, transactions), file bytes on the filesystem.

Layout under the store's root (by default `$BASAL_HOME/batches`):

    store.sqlite3 (+ -wal, -shm)   files, batches, and every finished line's record (`results`)
    files/<file id>.jsonl          uploaded inputs and finalized outputs, each written whole or not at all

A finished line is one row of `results`, inserted in the same transaction that counts it in the batch's
`request_counts`, keyed by (batch, line): a line is recorded once whatever crashes, and a record, once committed,
is the very bytes the output file will hold. Finalizing writes the output and error files atomically from those
rows, then commits the file rows and the batch's terminal status in one transaction; a crash in between leaves
the batch to be finalized again (an unreferenced file is removed at the next start).

`Store` is the whole interface the API and the runner use (plain values in, plain dicts out), so another
database (PostgreSQL, a server shared by several fronts) can implement the same methods later.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # statuses the runner still has work for
TERMINAL = ("completed", "failed", "expired", "cancelled")
BATCH_FIELDS = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)

SCHEMA = """
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
"""


class Conflict(Exception):
    """An idempotency key already used for a batch with other data (HTTP 409)."""


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


class Store:
    """SQLite metadata and the files directory. One connection behind one lock: the process's only writer, and
    each method one transaction. `clock` gives Unix seconds (tests pass a fake one)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time):
        self.root, self.clock = Path(root), clock
        self.files_dir = self.root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.root / "store.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed result survives a power cut, not only a kill
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.executescript(SCHEMA)
        self._sweep_orphans()

    def now(self) -> int:
        return int(self.clock())

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _sweep_orphans(self) -> None:
        """Files on disk without a row (an upload or a finalize cut short by a crash) and stale temporaries."""
        known = {r["id"] for r in self._query("SELECT id FROM files")}
        for path in self.files_dir.iterdir():
            if path.name.startswith(".") or path.stem not in known:
                path.unlink(missing_ok=True)

    # files

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    def upload_path(self) -> Path:
        """A temporary path in the files directory for an upload in progress (renamed by `add_file`)."""
        return self.files_dir / f".upload-{secrets.token_hex(8)}.tmp"

    def add_file(self, tmp: Path, filename: str, purpose: str, expires_after: int | None, lines: int) -> dict:
        """Move a fully written (and synced) upload into place and record it."""
        file_id, now = new_id("file-"), self.now()
        size = tmp.stat().st_size
        os.replace(tmp, self.file_path(file_id))
        expires = None if expires_after is None else now + expires_after
        self._tx(
            lambda db: db.execute(
                "INSERT INTO files (id, created_at, expires_at, filename, purpose, bytes, lines)"
                " VALUES (?,?,?,?,?,?,?)",
                (file_id, now, expires, filename, purpose, size, lines),
            )
        )
        return self.get_file(file_id)  # type: ignore[return-value]

    def get_file(self, file_id: str) -> dict | None:
        rows = self._query("SELECT * FROM files WHERE id = ?", (file_id,))
        return dict(rows[0]) if rows else None

    def list_files(self, after: str | None, limit: int, purpose: str | None) -> tuple[list[dict], bool]:
        """One page, newest first; `after` is the last id of the previous page. -> (rows, has_more)."""
        return self._page("files", after, limit, "purpose = ?" if purpose else "", (purpose,) if purpose else ())

    def delete_file(self, file_id: str) -> bool:
        deleted = self._tx(lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount)
        self.file_path(file_id).unlink(missing_ok=True)
        return bool(deleted)

    def _page(self, table: str, after: str | None, limit: int, where: str, args: tuple) -> tuple[list[dict], bool]:
        clauses, values = ([where] if where else []), list(args)
        if after is not None:
            clauses.append(f"seq < (SELECT seq FROM {table} WHERE id = ?)")
            values.append(after)
        sql = f"SELECT * FROM {table}" + (" WHERE " + " AND ".join(clauses) if clauses else "")
        rows = self._query(sql + " ORDER BY seq DESC LIMIT ?", (*values, limit + 1))
        return [dict(r) for r in rows[:limit]], len(rows) > limit

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
    ) -> tuple[dict, bool]:
        """A new batch in `validating`, or (with a key seen before and the same data) that batch again.
        -> (batch, created). Raises Conflict (the key with other data) or TooMany (`max_active` not terminal)."""
        fingerprint = json.dumps(
            [input_file_id, endpoint, completion_window, metadata, output_expires_s], sort_keys=True
        )
        now, batch_id = self.now(), new_id("batch_")

        def create(db: sqlite3.Connection) -> tuple[str, bool]:
            if idempotency_key is not None:
                row = db.execute(
                    "SELECT id, fingerprint FROM batches WHERE idempotency_key = ?", (idempotency_key,)
                ).fetchone()
                if row is not None:
                    if row["fingerprint"] != fingerprint:
                        raise Conflict(idempotency_key)
                    return row["id"], False
            active = db.execute(
                f"SELECT COUNT(*) FROM batches WHERE status IN ({','.join('?' * len(ACTIVE))})", ACTIVE
            ).fetchone()[0]
            if active >= max_active:
                raise TooMany(max_active)
            db.execute(
                "INSERT INTO batches (id, idempotency_key, fingerprint, input_file_id, endpoint, completion_window,"
                " status, metadata, output_expires_s, created_at, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    batch_id,
                    idempotency_key,
                    fingerprint,
                    input_file_id,
                    endpoint,
                    completion_window,
                    "validating",
                    None if metadata is None else json.dumps(metadata),
                    output_expires_s,
                    now,
                    now + window_s,
                ),
            )
            return batch_id, True

        found, created = self._tx(create)
        return self.get_batch(found), created  # type: ignore[return-value]

    def get_batch(self, batch_id: str) -> dict | None:
        rows = self._query("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return dict(rows[0]) if rows else None

    def list_batches(self, after: str | None, limit: int) -> tuple[list[dict], bool]:
        return self._page("batches", after, limit, "", ())

    def active_batches(self) -> list[dict]:
        """Batches the runner has work for, oldest first."""
        rows = self._query(
            f"SELECT * FROM batches WHERE status IN ({','.join('?' * len(ACTIVE))}) ORDER BY seq", ACTIVE
        )
        return [dict(r) for r in rows]

    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = ACTIVE, **fields: Any) -> bool:
        """Move a batch to `status` (stamping `<status>_at` with now) if it is in one of `only_from`; other
        columns (`total`, `errors`, `model`) may be set in the same transaction. -> whether it moved."""
        values = {**fields}
        if f"{status}_at" in BATCH_FIELDS:
            values[f"{status}_at"] = self.now()
        sets = ", ".join(["status = ?", *(f"{k} = ?" for k in values)])
        marks = ",".join("?" * len(only_from))
        return bool(
            self._tx(
                lambda db: (
                    db.execute(
                        f"UPDATE batches SET {sets} WHERE id = ? AND status IN ({marks})",
                        (status, *values.values(), batch_id, *only_from),
                    ).rowcount
                )
            )
        )

    # results

    def done_lines(self, batch_id: str) -> set[int]:
        return {r["line"] for r in self._query("SELECT line FROM results WHERE batch_id = ?", (batch_id,))}

    def add_results(self, batch_id: str, records: list[tuple[int, bool, bytes]]) -> int:
        """Record finished lines and count them, in one transaction; a line already recorded keeps its first
        record (never counted twice), and a batch that has ended takes no more. -> lines newly recorded."""

        def add(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row["status"] in TERMINAL:
                return 0
            ok = failed = 0
            for line, good, record in records:
                inserted = db.execute(
                    "INSERT OR IGNORE INTO results (batch_id, line, ok, record) VALUES (?,?,?,?)",
                    (batch_id, line, int(good), record),
                ).rowcount
                ok += inserted and good
                failed += inserted and not good
            db.execute(
                "UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?",
                (ok, failed, batch_id),
            )
            return ok + failed

        return self._tx(add)

    def records(self, batch_id: str, ok: bool) -> Iterator[bytes]:
        """The recorded lines of one kind, in input order."""
        rows = self._query(
            "SELECT record FROM results WHERE batch_id = ? AND ok = ? ORDER BY line", (batch_id, int(ok))
        )
        return (bytes(r["record"]) for r in rows)

    def finalize(self, batch_id: str, status: str, default_expires_s: int | None) -> bool:
        """Write the output and error files from the recorded lines (atomically), then, in one transaction, add
        them and move the batch to its terminal `status`. A kind with no line gets no file. -> whether it moved."""
        batch = self.get_batch(batch_id)
        if batch is None or batch["status"] in TERMINAL:
            return False
        expires_s = batch["output_expires_s"] or default_expires_s
        now = self.now()
        made: dict[str, tuple[str, int, int]] = {}
        for kind, ok in (("output_file_id", True), ("error_file_id", False)):
            records = list(self.records(batch_id, ok))
            if records:
                file_id = new_id("file-")
                size = write_bytes_atomic(self.file_path(file_id), (r + b"\n" for r in records))
                made[kind] = (file_id, size, len(records))
        stamp = f"{status}_at"

        def commit(db: sqlite3.Connection) -> bool:
            moved = db.execute(
                f"UPDATE batches SET status = ?, {stamp} = ?, output_file_id = ?, error_file_id = ?"
                f" WHERE id = ? AND status IN ({','.join('?' * len(ACTIVE))})",
                (
                    status,
                    now,
                    *(made.get(k, (None,))[0] for k in ("output_file_id", "error_file_id")),
                    batch_id,
                    *ACTIVE,
                ),
            ).rowcount
            if not moved:
                return False
            for kind, (file_id, size, lines) in made.items():
                name = f"{batch_id}_{'output' if kind == 'output_file_id' else 'error'}.jsonl"
                db.execute(
                    "INSERT INTO files (id, created_at, expires_at, filename, purpose, bytes, lines)"
                    " VALUES (?,?,?,?,?,?,?)",
                    (file_id, now, None if expires_s is None else now + expires_s, name, "batch_output", size, lines),
                )
            return True

        moved = self._tx(commit)
        if not moved:
            for file_id, _, _ in made.values():
                self.file_path(file_id).unlink(missing_ok=True)
        return moved

    # retention

    def sweep(self, batch_retention_s: int | None) -> tuple[int, int]:
        """Delete expired files, and terminal batches (with their records) older than `batch_retention_s`.
        -> (files, batches) deleted."""
        now = self.now()
        expired = [
            r["id"]
            for r in self._query("SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))
        ]
        for file_id in expired:
            self.delete_file(file_id)
        if batch_retention_s is None:
            return len(expired), 0
        marks = ",".join("?" * len(TERMINAL))
        old = [
            r["id"]
            for r in self._query(
                f"SELECT id FROM batches WHERE status IN ({marks}) AND created_at + ? <= ?",
                (*TERMINAL, batch_retention_s, now),
            )
        ]

        def drop(db: sqlite3.Connection) -> None:
            for batch_id in old:
                db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
                db.execute("DELETE FROM batches WHERE id = ?", (batch_id,))

        self._tx(drop)
        return len(expired), len(old)


class TooMany(Exception):
    """`max_active` batches are not terminal yet (HTTP 429)."""
