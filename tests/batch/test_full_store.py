"""A store that cannot write (a full or read-only disk, a database that refuses writes) pauses batch work: no new
line is sent while a write is refused (the computation count stops growing), the finished lines wait in memory,
the write is tried again with backoff, and once it succeeds the batch completes with every line exactly once and
the very records of a run without the fault. A batch that fails after lines were recorded publishes them. No
error says a server path. Each test on SQLite and a real PostgreSQL; one on a really full filesystem (a tmpfs)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from basal.batch import fault
from basal.batch.service import BatchService, BatchSettings
from basal.batch.store import Store, WriteFailed, open_store
from tests.postgres import database_for

LINES = 120
WINDOW = 16  # chunks of 8 lines: many claims and writes in one batch


def input_text(n: int = LINES) -> bytes:
    return b"".join(
        json.dumps(
            {"custom_id": f"c{i}", "method": "POST", "url": "/v1/basal", "body": {"state": f"s{i % 7}", "n": i}}
        ).encode()
        + b"\n"
        for i in range(n)
    )


class Decide:
    """A decision path double: a deterministic answer per body (its bytes and request id derived from the body),
    every call counted, `on_call(n)` run before the n-th answer; past `stall_after` calls a line runs until it is
    stopped. Called with one argument (a batch's owner, where the service takes a path per owner) it is itself."""

    def __init__(self, on_call: Callable[[int], None] = lambda n: None, stall_after: int | None = None):
        self.calls = 0
        self.on_call, self.stall_after = on_call, stall_after

    def __call__(self, *args: Any) -> Any:
        return self if len(args) == 1 else self.answer(*args)

    async def answer(self, body: bytes, cancelled: Callable[[], bool]) -> tuple[int, bytes, str]:
        if self.stall_after is not None and self.calls >= self.stall_after:
            while not cancelled():
                await asyncio.sleep(0.005)
            return 499, b"", ""  # not an answer: the line stays to be run
        self.calls += 1
        self.on_call(self.calls)
        await asyncio.sleep(0)
        digest = hashlib.sha256(body).hexdigest()[:16]
        status = 422 if json.loads(body)["n"] % 10 == 3 else 200  # some failed records too
        return status, json.dumps({"digest": digest}).encode(), f"req-{digest}"


class Refusing:
    """Every transaction of `store` raises `error()` inside it while `on` (reads go through): a disk that fills."""

    def __init__(self, store: Store, error: Callable[[], BaseException]):
        self.on, self.error, self._tx = False, error, store._tx  # type: ignore[attr-defined]

        def tx(fn, durable=True):
            def failing(db):
                if self.on:
                    raise self.error()
                return fn(db)

            return self._tx(failing, durable)

        store._tx = tx  # type: ignore[attr-defined]


def enospc(path: Path) -> Callable[[], OSError]:
    return lambda: OSError(errno.ENOSPC, "No space left on device", str(path / "store.sqlite3-wal"))


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(fault, "RETRY_MIN_S", 0.01)
    monkeypatch.setattr(fault, "RETRY_MAX_S", 0.05)


def service_on(store: Store, root: Path, decide: Decide) -> BatchService:
    svc = BatchService(store, BatchSettings(root=root, window=WINDOW))
    svc.attach(decide)
    return svc


def new_batch(store: Store, text: bytes = input_text()) -> str:
    tmp = store.upload_path()
    tmp.write_bytes(text)
    file = store.add_file(tmp, "in.jsonl", "batch", None, text.count(b"\n"))
    return store.create_batch(file["id"], "/v1/basal", 86400, "24h", None, None, None, 8)[0]["id"]


async def until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for a condition (the deadline only bounds a hang: no assertion depends on how long it took)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.005)


def output(store: Store, batch: dict) -> tuple[bytes, bytes]:
    read = lambda key: store.file_path(batch[key]).read_bytes() if batch[key] else b""  # noqa: E731
    return read("output_file_id"), read("error_file_id")


def reference(tmp_path: Path, database: str | None) -> tuple[bytes, bytes]:
    """The output and error files of the same batch run without a fault (a store of its own)."""
    root = tmp_path / "reference"
    store = open_store(root, database)

    async def run() -> dict:
        svc = service_on(store, root, Decide())
        batch_id = new_batch(store)
        await svc.start()
        try:
            await until(lambda: store.get_batch(batch_id)["status"] == "completed", "the reference completes")
            return store.get_batch(batch_id)
        finally:
            await svc.stop()

    return output(store, asyncio.run(run()))  # stop() closed the store; its files stay readable


def unstamped(*files: bytes) -> list[bytes]:
    """The records without their `id` (random per record): the bytes of everything else, in file order."""
    return [re.sub(rb'^\{"id":"batch_req_[0-9a-f]+",', b"{", r) for f in files for r in f.splitlines()]


def no_path(text: str, *paths: Path) -> None:
    assert not any(str(p) in text for p in paths), text
    assert "/" not in text.replace("/v1/", ""), text  # no path of any kind


def test_a_refused_write_pauses_the_batch_and_it_resumes_exactly_once(tmp_path, database, request):
    root = tmp_path / "store"
    store = open_store(root, database)
    refusing = Refusing(store, enospc(root))
    decide = Decide(on_call=lambda n: setattr(refusing, "on", True) if n == 40 else None)  # the disk fills
    svc = service_on(store, root, decide)
    batch_id = new_batch(store)

    async def run() -> None:
        await svc.start()
        try:
            await until(lambda: svc.fault.paused == batch_id and svc.fault.failures >= 3, "the batch pauses")
            paused_at = decide.calls
            assert paused_at < LINES
            failures = svc.fault.failures
            await until(lambda: svc.fault.failures >= failures + 3, "three more tries")
            assert decide.calls == paused_at  # no line sent while the store refuses
            row = store.get_batch(batch_id)
            assert row["status"] == "in_progress" and row["completed"] + row["failed"] < LINES
            assert svc.fault.reason == "no space left on the store's disk"
            errors = json.loads(svc.fault.batch_errors(row["errors"]))["data"][0]
            assert errors["code"] == "store_unwritable" and "paused" in errors["message"]
            no_path(errors["message"], root, tmp_path)
            refusing.on = False  # space again
            await until(lambda: store.get_batch(batch_id)["status"] == "completed", "the batch completes")
            assert svc.fault.reason is None and svc.fault.paused is None
        finally:
            await svc.stop()

    asyncio.run(run())
    store = open_store(root, database)  # stop() closed it
    done = store.get_batch(batch_id)
    store.close()
    assert decide.calls == LINES  # every line computed once: nothing again after the pause
    assert (done["completed"], done["failed"]) == (108, 12)
    out, err = output(store, done)
    ids = [json.loads(r)["custom_id"] for r in (out + err).splitlines()]
    assert sorted(ids) == sorted(f"c{i}" for i in range(LINES))  # each exactly once
    fresh = database and database_for("postgresql", request)  # the reference's own database
    assert unstamped(out, err) == unstamped(*reference(tmp_path, fresh))  # as a run without the fault


def test_a_read_only_database_pauses_too(tmp_path, database):
    """The database's own refusals (SQLite: read-only; PostgreSQL: disk full, a read-only transaction) are the
    same pause, said in words that do not carry the database server's file names."""
    root = tmp_path / "store"
    store = open_store(root, database)
    if database is None:
        import sqlite3

        def refusal() -> BaseException:
            e = sqlite3.OperationalError("attempt to write a readonly database")
            e.sqlite_errorcode = sqlite3.SQLITE_READONLY  # type: ignore[attr-defined]
            return e

        words = "the store's database is read-only"
    else:
        import psycopg

        refusal = lambda: psycopg.errors.DiskFull('could not extend file "base/16384/2619": No space left')  # noqa: E731
        words = "the batch database's disk is full"
    refusing = Refusing(store, refusal)
    refusing.on = True
    with pytest.raises(WriteFailed) as e:
        new_batch(store)
    assert e.value.reason == words
    refusing.on = False
    decide = Decide(on_call=lambda n: setattr(refusing, "on", True) if n == 20 else None)
    svc = service_on(store, root, decide)
    batch_id = new_batch(store)

    async def run() -> None:
        await svc.start()
        try:
            await until(lambda: svc.fault.paused == batch_id and svc.fault.failures >= 3, "the batch pauses")
            assert svc.fault.reason == words
            calls = decide.calls
            failures = svc.fault.failures
            await until(lambda: svc.fault.failures >= failures + 2, "two more tries")
            assert decide.calls == calls
            refusing.on = False
            await until(lambda: store.get_batch(batch_id)["status"] == "completed", "the batch completes")
        finally:
            await svc.stop()

    asyncio.run(run())
    assert decide.calls == LINES
    store = open_store(root, database)
    assert store.get_batch(batch_id)["completed"] + store.get_batch(batch_id)["failed"] == LINES
    store.close()


def test_a_failed_batch_publishes_the_records_it_committed(tmp_path, database):
    """Its input file deleted after 30 lines were recorded, a restarted server fails the batch: `failed`, its
    errors naming the file by id (never the store's path), and the 30 records in its output and error files."""
    root = tmp_path / "store"
    store = open_store(root, database)
    batch_id = new_batch(store)

    async def run(svc: BatchService, until_: Callable[[], bool], what: str) -> None:
        await svc.start()
        try:
            await until(until_, what)
        finally:
            await svc.stop()

    def recorded() -> int:
        row = store.get_batch(batch_id)
        return row["completed"] + row["failed"]

    first = service_on(store, root, Decide(stall_after=30))  # the other lines never finish on this server
    asyncio.run(run(first, lambda: recorded() >= 30, "30 lines recorded"))
    store = open_store(root, database)  # a restart
    committed = {json.loads(r)["custom_id"]: r for ok in (True, False) for r in store.records(batch_id, ok)}
    assert len(committed) == recorded() == 30
    store.delete_file(store.get_batch(batch_id)["input_file_id"])
    second = service_on(store, root, Decide())
    asyncio.run(run(second, lambda: store.get_batch(batch_id)["status"] == "failed", "the batch fails"))
    store = open_store(root, database)
    done = store.get_batch(batch_id)
    assert done["output_file_id"] is not None and done["failed_at"] is not None
    out, err = output(store, done)
    published = {json.loads(r)["custom_id"]: r for r in (out + err).splitlines()}
    assert published == committed  # every committed record, byte for byte, and nothing else
    error = json.loads(done["errors"])["data"][0]
    assert error["code"] == "invalid_input_file" and done["input_file_id"] in error["message"]
    no_path(error["message"], root, tmp_path)
    kinds = {store.get_file(done[k])["purpose"] for k in ("output_file_id", "error_file_id") if done[k]}
    assert kinds == {"batch_output"}
    store.close()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def fill(disk: Path) -> Path:
    """Fill the filesystem to the last byte; -> the filler (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 512)
    return filler


def test_a_really_full_filesystem_pauses_then_resumes(tmp_path):
    """SQLite on a 4 MB tmpfs filled mid-batch: SQLite's own SQLITE_FULL, then space freed."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "4m"):
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): the injected faults cover it")
    store = None
    try:
        root = disk / "store"
        store = open_store(root, None)
        filler: list[Path] = []
        decide = Decide(on_call=lambda n: filler.append(fill(disk)) if n == 30 else None)
        svc = service_on(store, root, decide)
        batch_id = new_batch(store, input_text(400))

        async def run() -> None:
            await svc.start()
            try:
                await until(lambda: svc.fault.paused == batch_id and svc.fault.failures >= 2, "the batch pauses")
                assert svc.fault.reason == "no space left on the store's disk"
                calls, failures = decide.calls, svc.fault.failures
                await until(lambda: svc.fault.failures >= failures + 2, "two more tries")
                assert decide.calls == calls < 400
                filler[0].unlink()
                await until(lambda: store.get_batch(batch_id)["status"] == "completed", "the batch completes")
            finally:
                await svc.stop()

        asyncio.run(run())
        store = open_store(root, None)
        done = store.get_batch(batch_id)
        assert decide.calls == 400
        out, err = output(store, done)
        ids = [json.loads(r)["custom_id"] for r in (out + err).splitlines()]
        assert sorted(ids) == sorted(f"c{i}" for i in range(400))
    finally:
        if store is not None:
            store.close()
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_without_a_hold_a_refused_write_ends_the_run_at_once():
    """`basal run-batch`'s runner (no hold): the first refused write ends the run, not after every line ran."""
    from basal.batch.lines import check_upload
    from basal.batch.runner import run_lines

    lines = check_upload(input_text(400), 1000, 1 << 20)
    decide = Decide()

    async def record(chunk: list) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/srv/out.jsonl")

    with pytest.raises(OSError):
        asyncio.run(run_lines(lines, decide, record, window=16))
    assert decide.calls < 400 // 2  # the window's lines and a few more, not the whole input
