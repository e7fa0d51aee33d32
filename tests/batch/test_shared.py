"""Several `basal serve` fronts on one PostgreSQL database and one files directory: a batch created on one is
listed, cancelled and downloaded on the other; both run one batch together and every custom_id appears once;
one SIGKILLed mid-batch loses and repeats nothing (its leases lapse, the other finishes); servers starting
together migrate once; the database restarted under a running batch: the servers reconnect and it completes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from basal_client import BasalClient

from tests.batch.test_crash import start, wait_ready
from tests.ports import free_port

LEASE_S = 2  # a killed server's chunks go to the other this soon


def requests_(n: int, tag: str = "") -> list[dict]:
    return [
        {"custom_id": f"{tag}s{i // 10}-q{i % 10}",
         "body": {"state": f"Ticket {i // 10}: the parcel came damaged.",
                  "questions": {f"q{i % 10}": {"type": "noul", "instructions": f"Is point {i % 10} about money?"}}}}
        for i in range(n)
    ]  # fmt: skip


class Fronts:
    """Two servers on one database and one shared files directory (each its own port, log and process)."""

    def __init__(self, demo_dir: Path, tmp_path: Path, url: str):
        self.db, self.processes, self.urls, self.logs = url, [], [], []
        for i in range(2):
            port = free_port()
            config = tmp_path / f"serve{i}.yml"
            config.write_text(
                f"addr: 127.0.0.1:{port}\nmodels:\n  - path: {demo_dir}\n"
                f"batches:\n  dir: {tmp_path / 'shared'}\n  database: {url}\n  lease_s: {LEASE_S}\n"
            )
            self.logs.append(tmp_path / f"serve{i}.log")
            self.urls.append(f"http://127.0.0.1:{port}")
            self.processes.append(start(config, self.logs[-1]))
        for process, url_, log in zip(self.processes, self.urls, self.logs, strict=True):
            wait_ready(url_, process, log)

    def sql(self, query: str, args: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            return conn.execute(query, args).fetchall()

    def recorded(self, batch_id: str) -> dict[int, bytes]:
        return {
            line: bytes(r) for line, r in self.sql("SELECT line, record FROM results WHERE batch_id=%s", (batch_id,))
        }

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def log_text(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in self.logs)


@pytest.fixture(scope="module")
def fronts(postgres, demo_dir, tmp_path_factory):
    """One pair for the module (starting two servers is most of its time); the kill test, last, ends it."""
    both = Fronts(demo_dir, tmp_path_factory.mktemp("fronts"), postgres.new_database())  # together, a fresh database
    try:
        yield both
    finally:
        both.close()


def wait(client: BasalClient, batch_id: str, timeout: float = 120) -> dict:
    """Poll until the batch is terminal, through the database's restart (a 503 is retried)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            batch = client.batches.retrieve(batch_id)
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return batch
        except Exception as e:  # the database restarting: 503, retried
            if getattr(e, "status_code", 503) != 503:
                raise
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} did not end")


def check_exactly_once(raw: bytes, reqs: list[dict]) -> list[bytes]:
    records = raw.splitlines()
    ids = [json.loads(r)["custom_id"] for r in records]
    assert len(ids) == len(set(ids)) == len(reqs) and set(ids) == {r["custom_id"] for r in reqs}
    return records


def test_two_fronts_share_files_and_batches_and_migrated_once(fronts):
    from basal.batch.postgres import MIGRATIONS

    assert [v for (v,) in fronts.sql("SELECT version FROM basal_batch_schema ORDER BY version")] == list(
        range(1, len(MIGRATIONS) + 1)
    )
    a, b = fronts.urls
    reqs = requests_(40, "x")
    with BasalClient(a) as one, BasalClient(b) as other:
        done = one.batches.create(requests=reqs, metadata={"job": "shared"})
        assert other.batches.retrieve(done["id"])["metadata"] == {"job": "shared"}
        assert done["id"] in [x["id"] for x in other.batches.list(limit=100)["data"]]
        assert done["input_file_id"] in [f["id"] for f in other.files.list(limit=100)["data"]]
        done = other.batches.wait(done["id"], timeout=120, poll_interval=0.1)
        assert done["status"] == "completed"
        check_exactly_once(other.files.content(done["output_file_id"]), reqs)
        assert one.files.content(done["output_file_id"]) == other.files.content(done["output_file_id"])
        # created on one, cancelled on the other (the slow batch is still running on the first)
        running = one.batches.create(requests=requests_(2000, "c"))
        deadline = time.monotonic() + 60
        while one.batches.retrieve(running["id"])["request_counts"]["completed"] < 10:
            assert time.monotonic() < deadline, fronts.log_text()
            time.sleep(0.02)
        cancelled = other.batches.cancel(running["id"])
        assert cancelled["status"] in ("cancelling", "cancelled")
        ended = one.batches.wait(running["id"], timeout=60, poll_interval=0.05)
        assert ended["status"] == "cancelled"
        kept = list(one.batches.results(running["id"]))
        assert len(kept) == len({r["custom_id"] for r in kept}) == ended["request_counts"]["completed"] < 2000
        assert len(fronts.recorded(running["id"])) == len(kept)  # nothing recorded after the end
        assert other.files.delete(done["input_file_id"])["deleted"]
        assert httpx.get(f"{a}/v1/files/{done['input_file_id']}").status_code == 404


def test_the_database_restarts_under_a_running_batch(fronts, postgres):
    a, _ = fronts.urls
    reqs = requests_(1500, "r")
    with BasalClient(a) as client:
        batch = client.batches.create(requests=reqs)
        deadline = time.monotonic() + 60
        while len(recorded := fronts.recorded(batch["id"])) < 100:
            assert time.monotonic() < deadline, fronts.log_text()
            time.sleep(0.02)
        assert len(recorded) < len(reqs), "the batch ended before the restart: raise its size"
        postgres.stop("fast")  # every connection dropped mid-transaction
        time.sleep(1.0)
        postgres.start()
        done = wait(client, batch["id"], timeout=180)
        raw = client.files.content(done["output_file_id"], max_bytes=64 << 20)
    assert done["status"] == "completed", fronts.log_text()
    assert done["request_counts"]["completed"] == len(reqs)
    check_exactly_once(raw, reqs)
    assert all(p.poll() is None for p in fronts.processes)


def test_both_fronts_run_one_batch_then_one_is_killed_and_the_other_finishes(fronts):
    """Last in the module: it kills the first front."""
    a, b = fronts.urls
    reqs = requests_(3000)
    owners: set[str] = set()
    with BasalClient(a) as client:
        batch = client.batches.create(requests=reqs)
    deadline = time.monotonic() + 60
    while len(owners) < 2 or len(before := fronts.recorded(batch["id"])) < 300:
        owners |= {o for (o,) in fronts.sql("SELECT DISTINCT owner FROM claims WHERE owner IS NOT NULL")}
        assert time.monotonic() < deadline, f"owners {owners}\n{fronts.log_text()}"
        time.sleep(0.02)
    fronts.processes[0].send_signal(signal.SIGKILL)  # its chunks in flight stay leased until LEASE_S lapses
    fronts.processes[0].wait(30)
    before = fronts.recorded(batch["id"])  # everything committed before the kill
    assert len(before) < len(reqs), "the batch ended before the kill: raise its size"
    with BasalClient(b) as client:
        done = client.batches.wait(batch["id"], timeout=180, poll_interval=0.1)
        raw = client.files.content(done["output_file_id"], max_bytes=64 << 20)
    assert done["status"] == "completed", fronts.log_text()
    assert done["request_counts"] == {"total": len(reqs), "completed": len(reqs), "failed": 0}
    output = set(check_exactly_once(raw, reqs))
    assert all(r in output for r in before.values())  # kept byte for byte
