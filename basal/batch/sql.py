"""The store's methods as SQL both databases run: one implementation, so SQLite and PostgreSQL keep one semantics.

A subclass gives the connection (`_tx` runs a function in one transaction, `_query` one read), its schema, and
two clauses: `LOCK_ROW`, which makes a transaction that reads a batch row hold it until commit (PostgreSQL's
`FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` already holds the whole database), and `SKIP_LOCKED`, which lets
concurrent claimers pass over a chunk another transaction is claiming. Statements use `?` placeholders.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from basal.batch.store import (
    ACTIVE,
    TERMINAL,
    Conflict,
    TooMany,
    WriteFailed,
    disk_problem,
    new_id,
    write_bytes_atomic,
)

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
ROWS_PER_INSERT = 500  # results rows in one INSERT (4 values each: far below SQLite's 32766 placeholders)


def _marks(n: int) -> str:
    return ",".join("?" * n)


class SqlStore(ABC):
    """The store's logic over a database connection that a subclass provides (see the module docstring)."""

    LOCK_ROW = ""
    SKIP_LOCKED = ""
    ORPHAN_GRACE_S = 0.0  # files without a row younger than this are left alone (another server may be writing)

    def __init__(self, root: Path, clock: Callable[[], float]):
        self.root, self.clock = Path(root), clock
        self.files_dir = self.root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)

    # the connection: a subclass's

    @abstractmethod
    def _tx(self, fn: Callable[[Any], Any], durable: bool = True) -> Any:
        """Run `fn(db)` in one transaction. `durable=False`: its commit need not reach the disk before it returns
        (leases: one lost to a power cut leaves its chunk claimable again, which is what a lapsed lease does)."""

    @abstractmethod
    def _query(self, sql: str, args: tuple = ()) -> list[dict]:
        """Rows of one read-only statement, as dicts."""

    def _before_create(self, db: Any) -> None:
        """Serialize batch creation across servers (the in-progress limit and idempotency keys hold for all). One
        server's database (SQLite) serializes writers itself: nothing to take."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the connection (or the pool)."""

    def now(self) -> int:
        return int(self.clock())

    def _sweep_orphans(self) -> None:
        """Files on disk without a row (an upload or a finalize cut short by a crash) and stale temporaries,
        once older than ORPHAN_GRACE_S."""
        known = {r["id"] for r in self._query("SELECT id FROM files")}
        before = time.time() - self.ORPHAN_GRACE_S
        for path in self.files_dir.iterdir():
            if path.name.startswith(".") or path.stem not in known:
                try:
                    if self.ORPHAN_GRACE_S <= 0 or path.stat().st_mtime < before:
                        path.unlink(missing_ok=True)
                except FileNotFoundError:
                    pass

    # files

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    def upload_path(self) -> Path:
        """A temporary path in the files directory for an upload in progress (renamed by `add_file`)."""
        return self.files_dir / f".upload-{secrets.token_hex(8)}.tmp"

    def add_file(
        self, tmp: Path, filename: str, purpose: str, expires_after: int | None, lines: int, owner: str | None = None
    ) -> dict:
        """Move a fully written (and synced) upload into place and record it as `owner`'s."""
        file_id, now = new_id("file-"), self.now()
        try:
            size = tmp.stat().st_size
            os.replace(tmp, self.file_path(file_id))
        except OSError as e:
            raise WriteFailed(disk_problem(e)) from e
        expires = None if expires_after is None else now + expires_after
        self._tx(
            lambda db: db.execute(
                "INSERT INTO files (id, created_at, expires_at, filename, purpose, bytes, lines, owner)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (file_id, now, expires, filename, purpose, size, lines, owner),
            )
        )
        return self.get_file(file_id)  # type: ignore[return-value]

    def get_file(self, file_id: str, owner: str | None = None) -> dict | None:
        """The file, or None; given an `owner`, only a file of that owner (another's is None, as a missing one)."""
        return self._row("files", file_id, owner)

    def list_files(
        self, after: str | None, limit: int, purpose: str | None, owner: str | None = None
    ) -> tuple[list[dict], bool]:
        """One page, newest first; `after` is the last id of the previous page; given an `owner`, only its files.
        -> (rows, has_more)."""
        return self._page("files", after, limit, "purpose = ?" if purpose else "", (purpose,) if purpose else (), owner)

    def delete_file(self, file_id: str) -> bool:
        deleted = self._tx(lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount)
        try:
            self.file_path(file_id).unlink(missing_ok=True)
        except OSError as e:  # its row is gone: the start-up sweep removes the file once the disk lets it
            raise WriteFailed(disk_problem(e)) from e
        return bool(deleted)

    def _row(self, table: str, row_id: str, owner: str | None) -> dict | None:
        sql, args = f"SELECT * FROM {table} WHERE id = ?", (row_id,)
        if owner is not None:
            sql, args = sql + " AND owner = ?", (row_id, owner)
        rows = self._query(sql, args)
        return dict(rows[0]) if rows else None

    def _page(
        self, table: str, after: str | None, limit: int, where: str, args: tuple, owner: str | None = None
    ) -> tuple[list[dict], bool]:
        clauses, values = ([where] if where else []), list(args)
        if owner is not None:
            clauses.append("owner = ?")
            values.append(owner)
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
        owner: str | None = None,
    ) -> tuple[dict, bool]:
        """A new batch in `validating`, `owner`'s, or (with a key seen before and the same data) that batch again.
        An idempotency key is the owner's own: another owner's use of the same key is another key.
        -> (batch, created). Raises Conflict (the key with other data) or TooMany (`max_active` not terminal)."""
        if idempotency_key is not None and owner is not None:
            idempotency_key = f"{owner}:{idempotency_key}"  # a digest holds no ':': no owner's key is another's
        fingerprint = json.dumps(
            [input_file_id, endpoint, completion_window, metadata, output_expires_s], sort_keys=True
        )
        now, batch_id = self.now(), new_id("batch_")

        def create(db: Any) -> tuple[str, bool]:
            self._before_create(db)
            if idempotency_key is not None:
                row = db.execute(
                    "SELECT id, fingerprint FROM batches WHERE idempotency_key = ?", (idempotency_key,)
                ).fetchone()
                if row is not None:
                    if row["fingerprint"] != fingerprint:
                        raise Conflict(idempotency_key)
                    return row["id"], False
            active = db.execute(
                f"SELECT COUNT(*) AS n FROM batches WHERE status IN ({_marks(len(ACTIVE))})", ACTIVE
            ).fetchone()["n"]
            if active >= max_active:
                raise TooMany(max_active)
            db.execute(
                "INSERT INTO batches (id, idempotency_key, fingerprint, input_file_id, endpoint, completion_window,"
                " status, metadata, output_expires_s, created_at, expires_at, owner) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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
                    owner,
                ),
            )
            return batch_id, True

        found, created = self._tx(create)
        return self.get_batch(found), created  # type: ignore[return-value]

    def get_batch(self, batch_id: str, owner: str | None = None) -> dict | None:
        """The batch, or None; given an `owner`, only a batch of that owner (another's is None, as a missing one)."""
        return self._row("batches", batch_id, owner)

    def list_batches(self, after: str | None, limit: int, owner: str | None = None) -> tuple[list[dict], bool]:
        return self._page("batches", after, limit, "", (), owner)

    def active_batches(self) -> list[dict]:
        """Batches the runner has work for, oldest first."""
        rows = self._query(f"SELECT * FROM batches WHERE status IN ({_marks(len(ACTIVE))}) ORDER BY seq", ACTIVE)
        return [dict(r) for r in rows]

    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = ACTIVE, **fields: Any) -> bool:
        """Move a batch to `status` (stamping `<status>_at` with now) if it is in one of `only_from`; other
        columns (`total`, `errors`, `model`) may be set in the same transaction. -> whether it moved."""
        values = {**fields}
        if f"{status}_at" in BATCH_FIELDS:
            values[f"{status}_at"] = self.now()
        sets = ", ".join(["status = ?", *(f"{k} = ?" for k in values)])

        def move(db: Any) -> bool:
            moved = db.execute(
                f"UPDATE batches SET {sets} WHERE id = ? AND status IN ({_marks(len(only_from))})",
                (status, *values.values(), batch_id, *only_from),
            ).rowcount
            if moved and status == "cancelling":
                self._announce_cancel(db, batch_id)
            return bool(moved)

        return self._tx(move)

    def _announce_cancel(self, db: Any, batch_id: str) -> None:
        """Tell the other servers, at commit, that `batch_id` is cancelling (`listen`); with one server, no one."""
        return None

    def listen(self, on_cancel: Callable[[str], None]) -> None:
        """Call `on_cancel(batch id)`, from another thread, as any server marks a batch `cancelling` (with one
        server, whose cancel route already tells its runner, there is nothing to listen to)."""
        return None

    # the lines of a running batch

    def start(self, batch_id: str, total: int, chunks: list[list[int]]) -> bool:
        """Move a `validating` batch to `in_progress` with `total` lines and split them into `chunks` (line
        numbers), unless it was split already (by another server, or before a crash): the first plan stands.
        -> whether the batch is in progress now."""
        now = self.now()

        def go(db: Any) -> bool:
            row = db.execute("SELECT status FROM batches WHERE id = ?" + self.LOCK_ROW, (batch_id,)).fetchone()
            if row is None or row["status"] not in ("validating", "in_progress"):
                return False
            if row["status"] == "validating":
                db.execute(
                    "UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ? WHERE id = ?",
                    (now, total, batch_id),
                )
            planned = db.execute("SELECT COUNT(*) AS n FROM claims WHERE batch_id = ?", (batch_id,)).fetchone()["n"]
            if not planned:
                db.executemany(
                    "INSERT INTO claims (batch_id, chunk, lines, done) VALUES (?,?,?,?)",
                    [(batch_id, i, json.dumps(lines), False) for i, lines in enumerate(chunks)],
                )
            return True

        return self._tx(go)

    def claim(self, batch_id: str, owner: str, lease_s: float) -> tuple[int, list[int]] | None:
        """Lease the first chunk of the batch that is not done and that no live lease holds to `owner` for
        `lease_s` seconds. -> (chunk, its lines not recorded yet), or None when there is none."""

        def go(db: Any) -> tuple[int, list[int]] | None:
            now = self.clock()
            row = db.execute(
                "UPDATE claims SET owner = ?, until = ? WHERE batch_id = ? AND chunk = (SELECT chunk FROM claims"
                " WHERE batch_id = ? AND NOT done AND (owner IS NULL OR until < ?) ORDER BY chunk LIMIT 1"
                + self.SKIP_LOCKED
                + ") RETURNING chunk, lines",
                (owner, now + lease_s, batch_id, batch_id, now),
            ).fetchone()
            if row is None:
                return None
            lines = json.loads(row["lines"])
            recorded = {
                r["line"]
                for r in db.execute(
                    f"SELECT line FROM results WHERE batch_id = ? AND line IN ({_marks(len(lines))})",
                    (batch_id, *lines),
                ).fetchall()
            }
            return row["chunk"], [n for n in lines if n not in recorded]

        return self._tx(go, durable=False)

    def renew(self, owner: str, lease_s: float) -> int:
        """Extend every lease `owner` holds by `lease_s` from now. -> chunks renewed."""
        until = self.clock() + lease_s
        return self._tx(
            lambda db: db.execute("UPDATE claims SET until = ? WHERE owner = ? AND NOT done", (until, owner)).rowcount,
            durable=False,
        )

    def settle(self, batch_id: str, chunk: int, owner: str) -> bool:
        """After `owner` ran a chunk: done if every line of it is recorded, else given up by `owner` (so any
        server may claim it again at once). -> whether it is done."""

        def go(db: Any) -> bool:
            row = db.execute(
                "SELECT lines FROM claims WHERE batch_id = ? AND chunk = ?" + self.LOCK_ROW, (batch_id, chunk)
            ).fetchone()
            if row is None:
                return False
            lines = json.loads(row["lines"])
            recorded = db.execute(
                f"SELECT COUNT(*) AS n FROM results WHERE batch_id = ? AND line IN ({_marks(len(lines))})",
                (batch_id, *lines),
            ).fetchone()["n"]
            if recorded == len(lines):
                db.execute(
                    "UPDATE claims SET done = ?, owner = NULL, until = NULL WHERE batch_id = ? AND chunk = ?",
                    (True, batch_id, chunk),
                )
                return True
            db.execute(
                "UPDATE claims SET owner = NULL, until = NULL WHERE batch_id = ? AND chunk = ? AND owner = ?",
                (batch_id, chunk, owner),
            )
            return False

        return self._tx(go, durable=False)

    def release(self, owner: str) -> int:
        """Give up every lease `owner` holds (its runs stopped). -> chunks released."""
        return self._tx(
            lambda db: (
                db.execute(
                    "UPDATE claims SET owner = NULL, until = NULL WHERE owner = ? AND NOT done", (owner,)
                ).rowcount
            )
        )

    # results

    def done_lines(self, batch_id: str) -> set[int]:
        return {r["line"] for r in self._query("SELECT line FROM results WHERE batch_id = ?", (batch_id,))}

    def add_results(
        self, batch_id: str, records: list[tuple[int, bool, bytes]], done_chunks: tuple[int, ...] = ()
    ) -> int:
        """Record finished lines and count them, in one transaction; a line already recorded keeps its first
        record (never counted twice), and a batch that has ended takes no more. `done_chunks`: chunks whose every
        line is recorded once these are, marked done in the same transaction. -> lines newly recorded."""

        def add(db: Any) -> int:
            row = db.execute("SELECT status FROM batches WHERE id = ?" + self.LOCK_ROW, (batch_id,)).fetchone()
            if row is None or row["status"] in TERMINAL:
                return 0
            ok = failed = 0
            for start in range(0, len(records), ROWS_PER_INSERT):
                part = records[start : start + ROWS_PER_INSERT]
                inserted = db.execute(
                    "INSERT INTO results (batch_id, line, ok, record) VALUES "
                    + ",".join(["(?,?,?,?)"] * len(part))
                    + " ON CONFLICT DO NOTHING RETURNING ok",
                    tuple(v for line, good, record in part for v in (batch_id, line, bool(good), record)),
                ).fetchall()
                good_rows = sum(1 for r in inserted if r["ok"])
                ok += good_rows
                failed += len(inserted) - good_rows
            if ok or failed:
                db.execute(
                    "UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?",
                    (ok, failed, batch_id),
                )
            if done_chunks:
                db.execute(
                    "UPDATE claims SET done = ?, owner = NULL, until = NULL"
                    f" WHERE batch_id = ? AND chunk IN ({_marks(len(done_chunks))})",
                    (True, batch_id, *done_chunks),
                )
            return ok + failed

        return self._tx(add)

    def records(self, batch_id: str, ok: bool) -> Iterator[bytes]:
        """The recorded lines of one kind, in input order."""
        rows = self._query("SELECT record FROM results WHERE batch_id = ? AND ok = ? ORDER BY line", (batch_id, ok))
        return (bytes(r["record"]) for r in rows)

    def finalize(self, batch_id: str, status: str, default_expires_s: int | None, errors: str | None = None) -> bool:
        """Write the output and error files from the recorded lines (atomically) and, in the same transaction
        that holds the batch (no record can be added meanwhile), add them and move the batch to its terminal
        `status` (a `failed` one with its `errors`: it keeps what it recorded). A kind with no line gets no
        file. -> whether it moved."""
        made: dict[str, tuple[str, int, int]] = {}

        def commit(db: Any) -> bool:
            batch = db.execute("SELECT * FROM batches WHERE id = ?" + self.LOCK_ROW, (batch_id,)).fetchone()
            if batch is None or batch["status"] in TERMINAL:
                return False
            expires_s = batch["output_expires_s"] or default_expires_s
            now = self.now()
            for kind, ok in (("output_file_id", True), ("error_file_id", False)):
                records = [
                    bytes(r["record"])
                    for r in db.execute(
                        "SELECT record FROM results WHERE batch_id = ? AND ok = ? ORDER BY line", (batch_id, ok)
                    ).fetchall()
                ]
                if records:
                    file_id = new_id("file-")
                    size = write_bytes_atomic(self.file_path(file_id), (r + b"\n" for r in records))
                    made[kind] = (file_id, size, len(records))
            db.execute(
                f"UPDATE batches SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ? WHERE id = ?",
                (status, now, *(made.get(k, (None,))[0] for k in ("output_file_id", "error_file_id")), batch_id),
            )
            if errors is not None:
                db.execute("UPDATE batches SET errors = ? WHERE id = ?", (errors, batch_id))
            for kind, (file_id, size, lines) in made.items():
                name = f"{batch_id}_{'output' if kind == 'output_file_id' else 'error'}.jsonl"
                expires = None if expires_s is None else now + expires_s
                db.execute(
                    "INSERT INTO files (id, created_at, expires_at, filename, purpose, bytes, lines, owner)"
                    " VALUES (?,?,?,?,?,?,?,?)",
                    (file_id, now, expires, name, "batch_output", size, lines, batch["owner"]),  # the batch's owner's
                )
            db.execute("DELETE FROM claims WHERE batch_id = ?", (batch_id,))
            return True

        try:
            return self._tx(commit)
        except BaseException:
            for file_id, _, _ in made.values():
                self.file_path(file_id).unlink(missing_ok=True)
            raise

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
        old = [
            r["id"]
            for r in self._query(
                f"SELECT id FROM batches WHERE status IN ({_marks(len(TERMINAL))}) AND created_at + ? <= ?",
                (*TERMINAL, batch_retention_s, now),
            )
        ]

        def drop(db: Any) -> None:
            for batch_id in old:
                db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
                db.execute("DELETE FROM claims WHERE batch_id = ?", (batch_id,))
                db.execute("DELETE FROM batches WHERE id = ?", (batch_id,))

        if old:
            self._tx(drop)
        return len(expired), len(old)
