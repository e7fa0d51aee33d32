"""Owners in the store, on SQLite and on a real PostgreSQL: a read given an owner finds only that owner's files
and batches (another's are None, as missing ones), pages and cursors included; idempotency keys are per owner;
finalized output files are the batch owner's; and a store written before owners existed opens, migrated, with its
rows owned by no key (found only by a read that sees everything: no keys, an admin key, `batches_shared`)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from basal.batch import postgres as pg
from basal.batch import sqlite as sq
from basal.batch.store import Conflict, Store, open_store

ALICE, BOB = "a" * 64, "b" * 64  # owners as the API stores them: a key's SHA-256 digest


@pytest.fixture
def store(tmp_path, database):
    opened = open_store(tmp_path, database, time.time)
    yield opened
    opened.close()


def upload(store: Store, owner: str | None, text: bytes = b'{"custom_id":"a"}\n') -> dict:
    tmp = store.upload_path()
    tmp.write_bytes(text)
    return store.add_file(tmp, "in.jsonl", "batch", None, text.count(b"\n"), owner)


def batch(store: Store, file_id: str, owner: str | None, key: str | None = None, metadata=None) -> tuple[dict, bool]:
    return store.create_batch(file_id, "/v1/basal", 86400, "24h", metadata, None, key, 8, owner)


def test_a_read_given_an_owner_finds_only_that_owners_rows(store):
    mine, theirs = upload(store, ALICE), upload(store, BOB)
    assert store.get_file(mine["id"], ALICE) == mine and store.get_file(mine["id"], BOB) is None
    assert store.get_file(mine["id"]) == mine  # no owner given: every row (no keys, admin, shared)
    assert [f["id"] for f in store.list_files(None, 10, None, ALICE)[0]] == [mine["id"]]
    assert [f["id"] for f in store.list_files(None, 10, None)[0]] == [theirs["id"], mine["id"]]
    b, _ = batch(store, mine["id"], ALICE)
    assert store.get_batch(b["id"], ALICE)["owner"] == ALICE and store.get_batch(b["id"], BOB) is None
    assert store.list_batches(None, 10, BOB) == ([], False)


def test_pages_of_one_owner_skip_the_others_rows(store):
    ids = [upload(store, owner)["id"] for owner in (ALICE, BOB, ALICE, BOB, ALICE)]
    first, more = store.list_files(None, 2, None, ALICE)
    assert [f["id"] for f in first] == [ids[4], ids[2]] and more
    rest, more = store.list_files(first[-1]["id"], 2, None, ALICE)
    assert [f["id"] for f in rest] == [ids[0]] and not more


def test_idempotency_keys_are_per_owner(store):
    a_file, b_file = upload(store, ALICE), upload(store, BOB)
    a, created = batch(store, a_file["id"], ALICE, "job-1")
    assert created and batch(store, a_file["id"], ALICE, "job-1") == (a, False)
    b, created = batch(store, b_file["id"], BOB, "job-1", {"other": "data"})  # not A's key: no conflict
    assert created and b["id"] != a["id"] and b["owner"] == BOB
    with pytest.raises(Conflict):
        batch(store, a_file["id"], ALICE, "job-1", {"other": "data"})


def test_the_output_files_are_the_batch_owners(store):
    b, _ = batch(store, upload(store, ALICE)["id"], ALICE)
    store.add_results(b["id"], [(1, True, b"ok"), (2, False, b"bad")])
    assert store.finalize(b["id"], "completed", None)
    done = store.get_batch(b["id"])
    for file_id in (done["output_file_id"], done["error_file_id"]):
        assert store.get_file(file_id, ALICE) is not None and store.get_file(file_id, BOB) is None


OLD_FILE, OLD_BATCH = "file-" + "1" * 32, "batch_" + "1" * 32


def _write_old_store(root, database: str | None) -> None:
    """A store as basal wrote it before owners: the migrations then, one file and one batch in it."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    (root / "files" / f"{OLD_FILE}.jsonl").write_bytes(b'{"custom_id":"a"}\n')
    rows = [
        (
            "INSERT INTO files (id, created_at, expires_at, filename, purpose, bytes, lines)"
            " VALUES (?,?,NULL,'old.jsonl','batch',18,1)",
            (OLD_FILE, 1_700_000_000),
        ),
        (
            "INSERT INTO batches (id, idempotency_key, fingerprint, input_file_id, endpoint, completion_window, status,"
            " created_at, expires_at) VALUES (?,'old-key','[]',?,'/v1/basal','24h','completed',?,?)",
            (OLD_BATCH, OLD_FILE, 1_700_000_000, 1_700_086_400),
        ),
    ]
    if database is None:
        db = sqlite3.connect(root / "store.sqlite3")
        for version, sql in enumerate(sq.MIGRATIONS[:2], 1):
            db.executescript(sql)
            db.execute(f"PRAGMA user_version = {version}")
        for sql, args in rows:
            db.execute(sql, args)
        db.commit()
        db.close()
        return
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        for statement in filter(str.strip, pg.MIGRATIONS[0].split(";")):
            conn.execute(statement)
        conn.execute(
            "CREATE TABLE basal_batch_schema (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL,"
            " applied_by TEXT NOT NULL)"
        )
        conn.execute("INSERT INTO basal_batch_schema VALUES (1, 0, 'an older basal')")
        for sql, args in rows:
            conn.execute(sql.replace("?", "%s"), args)


def test_a_store_from_before_owners_opens_with_its_rows_owned_by_no_key(tmp_path, database):
    _write_old_store(tmp_path, database)
    store = open_store(tmp_path, database, time.time)
    try:
        old_file, old_batch = store.get_file(OLD_FILE), store.get_batch(OLD_BATCH)
        assert old_file["owner"] is None and old_batch["owner"] is None and old_batch["status"] == "completed"
        assert store.get_file(OLD_FILE, ALICE) is None and store.get_batch(OLD_BATCH, ALICE) is None
        assert store.list_files(None, 10, None, ALICE) == ([], False)
        assert [b["id"] for b in store.list_batches(None, 10)[0]] == [OLD_BATCH]  # seen by those who see all
        assert store.file_path(OLD_FILE).exists()  # its bytes kept (not swept as an orphan)
        mine = upload(store, ALICE)  # and the migrated store takes owned rows
        assert [f["id"] for f in store.list_files(None, 10, None, ALICE)[0]] == [mine["id"]]
        again, created = batch(store, OLD_FILE, ALICE, "old-key")  # an old key is no key of an owner's
        assert created and again["id"] != OLD_BATCH
    finally:
        store.close()
    if database is None:
        version = sqlite3.connect(tmp_path / "store.sqlite3").execute("PRAGMA user_version").fetchone()[0]
        assert version == len(sq.MIGRATIONS)
