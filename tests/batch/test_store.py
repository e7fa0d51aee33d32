"""The batch store, each test on SQLite and on a real PostgreSQL: one record per line whatever is retried,
finalized files from the committed records byte for byte, cursor pages newest first, idempotency keys, the
in-progress limit, retention with a fake clock, a store reopened after a crash (records kept), and the chunk
leases that let several servers share a batch."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

from basal.batch.store import Conflict, Store, StoreError, TooMany, Unavailable, open_store


@pytest.fixture
def make(tmp_path, database):
    """Open the test's store (SQLite, or its own PostgreSQL database) as often as a test needs; all closed after."""
    opened: list[Store] = []

    def open_(clock=time.time) -> Store:
        opened.append(open_store(tmp_path, database, clock))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def upload(store: Store, text: bytes = b'{"custom_id":"a"}\n', expires: int | None = None) -> dict:
    tmp = store.upload_path()
    tmp.write_bytes(text)
    return store.add_file(tmp, "in.jsonl", "batch", expires, text.count(b"\n"))


def batch(store: Store, file_id: str, key: str | None = None, metadata=None, max_active: int = 8) -> tuple:
    return store.create_batch(file_id, "/v1/basal", 86400, "24h", metadata, None, key, max_active)


def test_a_line_is_recorded_once_and_counted_once(make):
    store = make()
    b, _ = batch(store, upload(store)["id"])
    assert store.add_results(b["id"], [(1, True, b"one"), (2, False, b"two")]) == 2
    assert store.add_results(b["id"], [(1, True, b"again"), (3, True, b"three")]) == 1  # line 1 keeps its record
    row = store.get_batch(b["id"])
    assert (row["completed"], row["failed"]) == (2, 1)
    assert list(store.records(b["id"], True)) == [b"one", b"three"]
    assert store.done_lines(b["id"]) == {1, 2, 3}


def test_finalize_writes_the_committed_records_and_moves_once(make):
    store = make()
    b, _ = batch(store, upload(store)["id"])
    store.add_results(b["id"], [(2, True, b'{"x":2}'), (1, True, b'{"x":1}'), (3, False, b'{"e":3}')])
    assert store.finalize(b["id"], "completed", 3600)
    assert not store.finalize(b["id"], "completed", 3600)  # terminal: nothing moves, no new files
    row = store.get_batch(b["id"])
    assert row["status"] == "completed" and row["completed_at"] is not None
    assert store.file_path(row["output_file_id"]).read_bytes() == b'{"x":1}\n{"x":2}\n'  # input order
    assert store.file_path(row["error_file_id"]).read_bytes() == b'{"e":3}\n'
    out = store.get_file(row["output_file_id"])
    assert out["purpose"] == "batch_output" and out["bytes"] == 16 and out["expires_at"] == out["created_at"] + 3600


def test_pages_are_newest_first_with_a_cursor(make):
    store = make()
    ids = [upload(store)["id"] for _ in range(5)]
    rows, more = store.list_files(None, 2, None)
    assert [r["id"] for r in rows] == ids[:-3:-1] and more
    rows, more = store.list_files(rows[-1]["id"], 10, None)
    assert [r["id"] for r in rows] == ids[2::-1] and not more
    assert store.list_files(None, 10, "batch_output") == ([], False)


def test_an_idempotency_key_replays_or_conflicts(make):
    store = make()
    f = upload(store)["id"]
    first, created = batch(store, f, "key-1", {"job": "a"})
    again, created_again = batch(store, f, "key-1", {"job": "a"})
    assert created and not created_again and again["id"] == first["id"]
    with pytest.raises(Conflict):
        batch(store, f, "key-1", {"job": "b"})
    assert batch(store, f, "key-2", {"job": "b"})[0]["id"] != first["id"]


def test_batches_in_progress_are_limited(make):
    store = make()
    f = upload(store)["id"]
    b, _ = batch(store, f, max_active=1)
    with pytest.raises(TooMany):
        batch(store, f, max_active=1)
    store.finalize(b["id"], "cancelled", None)
    batch(store, f, max_active=1)  # a finished batch no longer counts


def test_retention_with_a_fake_clock(make):
    clock = Clock()
    store = make(clock)
    kept, short = upload(store)["id"], upload(store, expires=3600)["id"]
    b, _ = batch(store, kept)
    store.add_results(b["id"], [(1, True, b"r")])
    store.finalize(b["id"], "completed", 7200)
    out = store.get_batch(b["id"])["output_file_id"]
    clock.t += 3600
    assert store.sweep(86400) == (1, 0)
    assert store.get_file(short) is None and not store.file_path(short).exists()
    clock.t += 86400
    assert store.sweep(86400) == (1, 1)  # the output file, then the batch and its records
    assert store.get_file(out) is None and store.get_batch(b["id"]) is None and store.get_file(kept) is not None


def test_reopened_store_keeps_records_and_sweeps_orphans(make, database):
    store = make()
    b, _ = batch(store, upload(store)["id"])
    store.add_results(b["id"], [(1, True, b"kept")])
    orphan = store.file_path("file-orphan")
    orphan.write_bytes(b"half")
    store.upload_path().write_bytes(b"partial upload")
    store.close()
    again = make()
    assert list(again.records(b["id"], True)) == [b"kept"]
    assert json.loads(json.dumps(again.active_batches()))[0]["id"] == b["id"]
    if database is None:  # one server owns the directory: what no row names is a crash's leftover
        assert not orphan.exists() and [p.name for p in again.files_dir.iterdir() if p.name.startswith(".")] == []
    else:  # another server may be between writing a file and committing its row: only old leftovers go
        assert orphan.exists()
        old = time.time() - 2 * again.ORPHAN_GRACE_S
        os.utime(orphan, (old, old))
        again.close()
        make()
        assert not orphan.exists()


def test_an_ended_batch_takes_no_more_records(make):
    store = make()
    b, _ = batch(store, upload(store)["id"])
    store.add_results(b["id"], [(1, True, b"r")])
    store.finalize(b["id"], "cancelled", None)
    assert store.add_results(b["id"], [(2, True, b"late")]) == 0
    assert store.get_batch(b["id"])["completed"] == 1 and store.done_lines(b["id"]) == {1}


def test_chunks_are_leased_to_one_server_and_lapse(make):
    clock = Clock()
    store = make(clock)
    b, _ = batch(store, upload(store)["id"])
    assert store.start(b["id"], 4, [[3, 1], [2], [4]])
    assert store.start(b["id"], 4, [[1, 2, 3, 4]])  # already in progress: the first plan stands
    assert store.get_batch(b["id"])["status"] == "in_progress" and store.get_batch(b["id"])["total"] == 4
    assert store.claim(b["id"], "a", 30) == (0, [3, 1])
    assert store.claim(b["id"], "b", 30) == (1, [2])
    assert store.claim(b["id"], "b", 30) == (2, [4])
    assert store.claim(b["id"], "c", 30) is None  # every chunk is held by a live lease
    store.add_results(b["id"], [(3, True, b"three")])
    clock.t += 31  # a's lease lapses (a was killed); b renews
    assert store.renew("b", 30) == 2
    assert store.claim(b["id"], "c", 30) == (0, [1])  # line 3 is recorded: only line 1 runs again
    assert store.claim(b["id"], "c", 30) is None
    assert not store.settle(b["id"], 0, "a")  # a's late settle gives up nothing of c's
    assert store.claim(b["id"], "d", 30) is None
    store.add_results(b["id"], [(2, True, b"two")])
    assert store.settle(b["id"], 1, "b")  # every line recorded: done, never claimed again
    assert not store.settle(b["id"], 2, "b")  # line 4 is not: given up, claimable at once
    assert store.claim(b["id"], "d", 30) == (2, [4])
    assert store.release("d") == 1 and store.release("c") == 1
    assert store.claim(b["id"], "e", 30) == (0, [1])
    assert store.add_results(b["id"], [(1, True, b"one")], (0,)) == 1  # its last line: done in that transaction
    assert store.claim(b["id"], "f", 30) == (2, [4])
    store.add_results(b["id"], [(4, True, b"four")], (2,))
    assert store.claim(b["id"], "g", 30) is None  # every chunk done
    store.finalize(b["id"], "cancelled", None)
    assert store.claim(b["id"], "e", 30) is None  # a finished batch has no chunks left


def test_concurrent_claims_never_lease_a_chunk_twice(make):
    """Eight servers' worth of threads claiming at once, each on its own store (its own connections)."""
    stores = [make() for _ in range(4)]
    b, _ = batch(stores[0], upload(stores[0])["id"])
    stores[0].start(b["id"], 60, [[i + 1] for i in range(60)])
    got: list[int] = []

    def claimer(store: Store, owner: str) -> None:
        while (claim := store.claim(b["id"], owner, 30)) is not None:
            got.append(claim[0])

    threads = [threading.Thread(target=claimer, args=(stores[i % 4], f"o{i}")) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(60))


def test_records_added_while_finalizing_are_in_the_files_or_not_counted(make, database):
    """Another server (with SQLite, another thread: one server owns an SQLite store) records lines while this one
    finalizes: the counts always equal the finalized records."""
    store = make()
    other = store if database is None else make()
    b, _ = batch(store, upload(store)["id"])
    lines = iter(range(1, 100_000))
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            other.add_results(b["id"], [(next(lines), True, b"r")])

    writer = threading.Thread(target=record)
    writer.start()
    try:
        time.sleep(0.2)
        assert store.finalize(b["id"], "cancelled", None)
        time.sleep(0.1)
    finally:
        stop.set()
        writer.join()
    row = store.get_batch(b["id"])
    assert row["completed"] == len(store.file_path(row["output_file_id"]).read_bytes().splitlines()) > 0


def test_servers_starting_together_migrate_once(postgres, tmp_path):
    """Eight stores opened at once on one fresh database: each migration applied once, every one of them opens."""
    from basal.batch.postgres import MIGRATIONS

    url = postgres.new_database()
    opened: list[Store] = []
    failed: list[BaseException] = []
    gate = threading.Barrier(8)

    def open_one() -> None:
        gate.wait()
        try:
            opened.append(open_store(tmp_path, url))
        except BaseException as e:
            failed.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not failed, failed
        rows = opened[0]._query("SELECT version FROM basal_batch_schema ORDER BY version")
        assert [r["version"] for r in rows] == list(range(1, len(MIGRATIONS) + 1))
    finally:
        for store in opened:
            store.close()


def test_an_idempotency_key_holds_across_servers(postgres, tmp_path):
    """Two servers (two pools) creating with one key at once: one batch."""
    url = postgres.new_database()
    stores = [open_store(tmp_path, url) for _ in range(2)]
    try:
        f = upload(stores[0])["id"]
        made: list[tuple] = []
        failed: list[BaseException] = []
        gate = threading.Barrier(8)

        def create(store: Store) -> None:
            gate.wait()
            try:
                made.append(batch(store, f, "shared-key", {"job": "a"}))
            except BaseException as e:
                failed.append(e)

        threads = [threading.Thread(target=create, args=(stores[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed, failed
        assert len({b["id"] for b, _ in made}) == 1 and sum(created for _, created in made) == 1
    finally:
        for store in stores:
            store.close()


def test_a_server_whose_files_directory_is_not_the_shared_one_refuses_to_start(postgres, tmp_path):
    url = postgres.new_database()
    first = open_store(tmp_path / "shared", url)
    try:
        open_store(tmp_path / "shared", url).close()  # the same volume: fine
        with pytest.raises(StoreError, match="mount the shared volume"):
            open_store(tmp_path / "local", url)
    finally:
        first.close()


def test_a_restarted_sqlite_server_resumes_at_once_a_shared_store_after_the_lease(make, database):
    store = make()
    b, _ = batch(store, upload(store)["id"])
    store.start(b["id"], 1, [[1]])
    assert store.claim(b["id"], "killed", 30) == (0, [1])
    store.close()
    again = make()  # SQLite: one server owns the store, so the dead process's leases go at open
    assert (again.claim(b["id"], "restarted", 30) is None) == (database is not None)


def test_calls_on_an_event_loop_fail_fast_while_the_database_is_down(postgres, tmp_path):
    """The API reads the store on the server's event loop: a database that is down answers at once (503), it
    does not stall the loop, and calls succeed again once it is back."""
    store = open_store(tmp_path, postgres.new_database())

    async def on_loop() -> float:
        started = time.monotonic()
        for _ in range(5):
            with pytest.raises(Unavailable):
                store.get_batch("batch_x")
        return time.monotonic() - started

    try:
        postgres.stop("fast")
        try:
            assert asyncio.run(on_loop()) < 2.0  # five calls: the pool's 10 s wait would be 50 s
        finally:
            postgres.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert store.get_batch("batch_x") is None
                break
            except Unavailable:
                assert time.monotonic() < deadline, "the store did not reconnect"
                time.sleep(0.2)
    finally:
        store.close()


def test_a_cancel_on_one_server_reaches_the_others_listening(postgres, tmp_path):
    url = postgres.new_database()
    here, there = open_store(tmp_path, url), open_store(tmp_path, url)
    heard: list[str] = []
    try:
        here.listen(heard.append)
        b, _ = batch(there, upload(there)["id"])
        time.sleep(0.3)  # the listener's connection is up
        started = time.monotonic()
        assert there.set_status(b["id"], "cancelling", ("validating", "in_progress"))
        while not heard and time.monotonic() - started < 5:
            time.sleep(0.005)
        assert heard == [b["id"]] and time.monotonic() - started < 1.0
        assert not there.set_status(b["id"], "cancelling", ("validating", "in_progress"))  # no move, no word
        time.sleep(0.3)
        assert heard == [b["id"]]
    finally:
        here.close()
        there.close()
