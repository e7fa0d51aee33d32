"""Nothing lost, nothing twice: a real `basal serve` killed with SIGKILL in the middle of a batch and started again
on the same store finishes the batch with every custom_id exactly once, and the records committed before the kill
are in the output byte for byte."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
from basal_client import BasalClient

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
LINES = 3000  # enough that the batch cannot finish between two looks at the store (about 10 s of the demo model)


def start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = open(log, "ab")  # noqa: SIM115 - the child owns it; closed with the test's tmp dir
    process = subprocess.Popen([sys.executable, "-m", "basal", "serve", "--config", str(config)], cwd=ROOT, env=env,
                               stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    return process


def wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the server did not start:\n{log.read_text()}")


def committed(db: Path, batch_id: str) -> dict[int, bytes]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return {
            line: bytes(r) for line, r in c.execute("SELECT line, record FROM results WHERE batch_id=?", (batch_id,))
        }


def test_sigkill_mid_batch_then_restart_loses_and_repeats_nothing(demo_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = tmp_path / "store"
    config = tmp_path / "serve.yml"
    config.write_text(f"addr: 127.0.0.1:{port}\nmodels:\n  - path: {demo_dir}\nbatches:\n  dir: {store}\n")
    log = tmp_path / "serve.log"
    reqs = [
        {"custom_id": f"s{i // 10}-q{i % 10}",
         "body": {"state": f"Ticket {i // 10}: the parcel came damaged.",
                  "questions": {f"q{i % 10}": {"type": "noul", "instructions": f"Is point {i % 10} about money?"}}}}
        for i in range(LINES)
    ]  # fmt: skip
    first = start(config, log)
    try:
        wait_ready(url, first, log)
        with BasalClient(url) as client:
            batch = client.batches.create(requests=reqs)
        db = store / "store.sqlite3"
        deadline = time.monotonic() + 60
        while len(before := committed(db, batch["id"])) < 50:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    before = committed(db, batch["id"])  # everything committed before the kill
    assert 50 <= len(before) < LINES, "the batch ended before the kill: raise LINES"

    second = start(config, log)
    try:
        wait_ready(url, second, log)
        with BasalClient(url) as client:
            done = client.batches.wait(batch["id"], timeout=120, poll_interval=0.2)
            raw = client.files.content(done["output_file_id"], max_bytes=64 << 20)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(60)
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    records = raw.splitlines()
    ids = [json.loads(r)["custom_id"] for r in records]
    assert len(ids) == len(set(ids)) == LINES and set(ids) == {r["custom_id"] for r in reqs}
    output = set(records)
    assert all(r in output for r in before.values())  # kept byte for byte
