"""The shared store: PostgreSQL (`batches.database: postgresql://…`), for several fronts serving one set of batches.

Every front opens a pool of connections (psycopg 3, the `postgres` extra) to one database and mounts one files
directory (`batches.dir`, a shared volume). The SQL is `basal.batch.sql`'s, the same as SQLite's; here a
transaction that reads a batch row holds it (`FOR UPDATE`), so a record is counted once and a finalize sees every
record of its batch, and a chunk is claimed with `FOR UPDATE SKIP LOCKED`, so two servers never lease one chunk.

The schema is versioned (`basal_batch_schema`: one row per migration applied) and migrated at open inside one
transaction holding an advisory lock: servers starting together migrate once, the others wait and find it done.
A connection lost (the database restarted) surfaces as `Unavailable` (503 at the API; the runner tries again);
the pool drops a connection that failed and opens new ones in the background (no check before each loan: that
would cost a round trip per transaction).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from basal.batch.sql import SqlStore
from basal.batch.store import StoreError, Unavailable, WriteFailed, disk_problem, redact, write_bytes_atomic

log = logging.getLogger(__name__)

LOCK_MIGRATE = 0x62617361_6C000001  # pg_advisory_xact_lock keys: "basal" and a number
LOCK_CREATE = 0x62617361_6C000002
POOL_MAX = 8  # connections per server: the runner's few at a time, and the API's calls
CONNECT_TIMEOUT_S = 5
CHANNEL = "basal_batch_cancel"  # NOTIFY channel: a batch id, as a server marks it cancelling
LOOP_WAIT_S = 0.5  # the longest a call on an event loop waits for a connection
DOWN_S = 1.0  # after a failure, calls on an event loop fail at once for this long

MIGRATIONS = (
    """
CREATE TABLE files (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    lines BIGINT NOT NULL
);
CREATE TABLE batches (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT UNIQUE,
    fingerprint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    model TEXT,
    status TEXT NOT NULL,
    metadata TEXT,
    output_expires_s BIGINT,
    errors TEXT,
    output_file_id TEXT,
    error_file_id TEXT,
    total BIGINT NOT NULL DEFAULT 0,
    completed BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    in_progress_at BIGINT,
    expires_at BIGINT NOT NULL,
    finalizing_at BIGINT,
    completed_at BIGINT,
    failed_at BIGINT,
    expired_at BIGINT,
    cancelling_at BIGINT,
    cancelled_at BIGINT
);
CREATE INDEX batches_status ON batches (status);
CREATE TABLE results (
    batch_id TEXT NOT NULL,
    line BIGINT NOT NULL,
    ok BOOLEAN NOT NULL,
    record BYTEA NOT NULL,
    PRIMARY KEY (batch_id, line)
);
CREATE TABLE claims (
    batch_id TEXT NOT NULL,
    chunk INTEGER NOT NULL,
    lines TEXT NOT NULL,
    owner TEXT,
    until DOUBLE PRECISION,
    done BOOLEAN NOT NULL,
    PRIMARY KEY (batch_id, chunk)
);
CREATE INDEX claims_owner ON claims (owner);
CREATE TABLE store_identity (id TEXT NOT NULL)
""",
    """
ALTER TABLE files ADD COLUMN owner TEXT;
ALTER TABLE batches ADD COLUMN owner TEXT;
CREATE INDEX files_owner ON files (owner, seq);
CREATE INDEX batches_owner ON batches (owner, seq)
""",
)
MARKER = ".basal-store-id"  # in the files' root: the database's store id, so a server whose volume is not the
# shared one refuses to start instead of failing every batch whose input it cannot see


@functools.cache
def _pg(sql: str) -> str:
    """The shared SQL's `?` placeholders as psycopg's `%s`."""
    return sql.replace("?", "%s")


class _Db:
    """One connection inside one transaction, with the shared SQL's placeholders."""

    def __init__(self, conn: Any):
        self.conn = conn

    def execute(self, sql: str, args: tuple = ()) -> Any:
        return self.conn.execute(_pg(sql), args)

    def executemany(self, sql: str, rows: list[tuple]) -> Any:
        cur = self.conn.cursor()
        cur.executemany(_pg(sql), rows)
        return cur


class PostgresStore(SqlStore):
    """PostgreSQL metadata (a pool of connections) and the files directory every server mounts."""

    LOCK_ROW = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ORPHAN_GRACE_S = 3600.0  # another server may be between writing a file and committing its row

    def __init__(self, root: Path, url: str, clock: Callable[[], float] = time.time):
        try:
            import psycopg
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError as e:
            raise StoreError(
                f"batches.database is PostgreSQL, which needs psycopg: pip install 'basal-bitwise[postgres]' ({e})"
            ) from e
        super().__init__(root, clock)
        self._down_until = 0.0  # monotonic time until which calls on an event loop fail at once
        self._url, self._closed = url, False
        self._listener: threading.Thread | None = None
        self._errors: tuple[type[BaseException], ...] = (psycopg.OperationalError, PoolTimeout)
        self._refusals: tuple[type[BaseException], ...] = (
            psycopg.errors.DiskFull,
            psycopg.errors.ReadOnlySqlTransaction,  # a standby, or default_transaction_read_only
            psycopg.errors.IoError,
        )
        self._where = redact(url)
        connect = {"autocommit": True, "row_factory": dict_row, "connect_timeout": CONNECT_TIMEOUT_S}
        try:  # one connection first: a wrong URL or password fails here at once, with the server's own words
            with psycopg.connect(url, **connect) as conn:
                self._migrate(conn)
        except psycopg.OperationalError as e:
            raise StoreError(f"cannot use the batch database at {self._where}: {e}") from e
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            kwargs=connect,
            timeout=10.0,
            open=True,
            name="basal-batches",
        )
        try:
            self._sweep_orphans()
        except BaseException:
            self._pool.close()
            raise

    def _migrate(self, conn: Any) -> None:
        """Apply the migrations this database lacks, once whoever else starts at the same time."""
        with conn.transaction():
            db = _Db(conn)
            db.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_MIGRATE,))
            db.execute(
                "CREATE TABLE IF NOT EXISTS basal_batch_schema (version INTEGER PRIMARY KEY,"
                " applied_at BIGINT NOT NULL, applied_by TEXT NOT NULL)"
            )
            version = db.execute("SELECT COALESCE(MAX(version), 0) AS v FROM basal_batch_schema").fetchone()["v"]
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"the batch database at {self._where} is at schema {version}, newer than this basal's"
                    f" {len(MIGRATIONS)}: upgrade basal"
                )
            for step, sql in enumerate(MIGRATIONS[version:], version + 1):
                for statement in filter(str.strip, sql.split(";")):
                    db.execute(statement)
                db.execute(
                    "INSERT INTO basal_batch_schema (version, applied_at, applied_by) VALUES (?,?,?)",
                    (step, int(time.time()), f"{socket.gethostname()}:{os.getpid()}"),
                )
                log.info("batches: migrated the database at %s to schema %d", self._where, step)
            self._check_root(db)

    def _check_root(self, db: _Db) -> None:
        """The first server names the store (a row, and a marker file in its root); every later one must find
        that marker in its own root, i.e. mount the same volume."""
        marker = self.root / MARKER
        row = db.execute("SELECT id FROM store_identity").fetchone()
        if row is None:
            token = secrets.token_hex(16)
            write_bytes_atomic(marker, [token.encode()])
            db.execute("INSERT INTO store_identity (id) VALUES (?)", (token,))
            return
        mine = marker.read_text().strip() if marker.exists() else None
        if mine != row["id"]:
            raise StoreError(
                f"batches.dir {self.root} is not the files directory of the other servers on the batch database"
                f" at {self._where} ({MARKER} {'is missing' if mine is None else 'names another store'}):"
                " mount the shared volume at batches.dir on every server"
            )

    def _before_create(self, db: Any) -> None:
        db.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_CREATE,))

    def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.join(5)
        self._pool.close()

    def _announce_cancel(self, db: Any, batch_id: str) -> None:
        db.execute("SELECT pg_notify(?, ?)", (CHANNEL, batch_id))

    def listen(self, on_cancel: Callable[[str], None]) -> None:
        """A thread with a connection of its own LISTENing on CHANNEL: a cancel on any front reaches the runners
        of the others within milliseconds, so their lines stop at the engine's next checkpoint (the runner's
        status poll is the fallback while this connection is down)."""
        self._listener = threading.Thread(target=self._listen, args=(on_cancel,), name="basal-batches-listen")
        self._listener.daemon = True
        self._listener.start()

    def _listen(self, on_cancel: Callable[[str], None]) -> None:
        import psycopg

        while not self._closed:
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._closed:
                        for note in conn.notifies(timeout=0.5):
                            on_cancel(note.payload)
            except psycopg.OperationalError as e:  # the database restarts: listen again once it is back
                log.debug("batches: the cancel listener reconnects: %s", e)
                time.sleep(0.5)

    def _connection(self) -> Any:
        """A pooled connection. On an event loop's thread (the API's routes read the store there) it waits at
        most LOOP_WAIT_S, and not at all for DOWN_S after a failure: a database that is down must not stall
        the online requests that share the loop."""
        on_loop = _on_event_loop()
        if on_loop and time.monotonic() < self._down_until:
            raise Unavailable(f"the batch database at {self._where} was unavailable a moment ago")
        return self._pool.connection(timeout=LOOP_WAIT_S if on_loop else None)

    def _failed(self, e: BaseException) -> Unavailable:
        self._down_until = time.monotonic() + DOWN_S
        return Unavailable(f"the batch database at {self._where} is unavailable: {e}")

    def _tx(self, fn: Callable[[Any], Any], durable: bool = True) -> Any:
        try:
            with self._connection() as conn, conn.transaction():
                if not durable:
                    conn.execute("SET LOCAL synchronous_commit TO OFF")
                return fn(_Db(conn))
        except self._refusals as e:  # before _errors: a full disk is an OperationalError too
            raise WriteFailed(_refusal(e)) from e
        except OSError as e:  # the shared files directory
            raise WriteFailed(disk_problem(e)) from e
        except self._errors as e:
            raise self._failed(e) from e

    def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        try:
            with self._connection() as conn:
                return conn.execute(_pg(sql), args).fetchall()
        except self._errors as e:
            raise self._failed(e) from e


def _refusal(e: BaseException) -> str:
    """Why the database refused a write, by its SQLSTATE (its own message names files on the database's server)."""
    state = getattr(e, "sqlstate", None) or ""
    if state == "53100":
        return "the batch database's disk is full"
    if state == "25006":
        return "the batch database is read-only"
    return f"the batch database reports an I/O error (SQLSTATE {state})"


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
