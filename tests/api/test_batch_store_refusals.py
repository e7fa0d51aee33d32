"""The Files and Batches API over a store that cannot write: an upload gets a 507 with the API's JSON error (no
server path in it), a running batch pauses and says so on the batch (`errors`), on `/health/ready` (200,
`degraded`, with the reason: online decisions go on) and in `/metrics`, then completes once the store writes
again, every line exactly once and computed once. The demo model answers the lines; the fault is injected in the
store's write path (tests/batch/test_full_store.py also fills a real filesystem)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.batch import fault
from basal.batch.service import BatchService, BatchSettings
from basal.batch.store import open_store
from tests.batch.test_full_store import Refusing, enospc, fill
from tests.servers import make_engines

LINES = 160


@pytest.fixture
def engines(demo_model):
    return make_engines(demo_model)  # each test its own: an app's shutdown closes them


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(fault, "RETRY_MIN_S", 0.01)
    monkeypatch.setattr(fault, "RETRY_MAX_S", 0.05)


class Counted:
    """The lines' decision path, each call counted (`on_call(n)` before the n-th); called with one argument (a
    batch's owner, where the service takes a path per owner) it counts that owner's path."""

    def __init__(self, decide: Callable, on_call: Callable[[int], None], calls: list[int] | None = None):
        self.decide, self.on_call, self.calls = decide, on_call, calls if calls is not None else [0]

    def __call__(self, *args: Any) -> Any:
        if len(args) == 1:
            return Counted(self.decide(*args), self.on_call, self.calls)
        self.calls[0] += 1
        self.on_call(self.calls[0])
        return self.decide(*args)


def jsonl(n: int) -> bytes:
    return b"".join(
        json.dumps({
            "custom_id": f"c{i}", "method": "POST", "url": "/v1/basal",
            "body": {"state": f"Ticket {i // 8}: the parcel came damaged.",
                     "questions": {"q": {"type": "noul", "instructions": f"Is point {i % 8} about money?"}}},
        }).encode() + b"\n"
        for i in range(n)
    )  # fmt: skip


def upload(client: TestClient, data: bytes):
    return client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)})


def metric(client: TestClient, name: str) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} is not in /metrics")


def wait(check, what: str, timeout: float = 60.0) -> None:
    """The deadline only bounds a hang: no assertion depends on how long anything took."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def refused(r, *paths: Path) -> dict:
    assert r.status_code == 507, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "store_unwritable"
    assert not any(str(p) in r.text for p in paths) and "/tmp" not in r.text, r.text
    return error


def test_an_upload_the_store_cannot_write_is_a_507_and_a_paused_batch_says_so(engines, tmp_path, database):
    root = tmp_path / "store"
    svc = BatchService(open_store(root, database), BatchSettings(root=root, database=database, window=16))
    refusing = Refusing(svc.store, enospc(root))
    calls = [0]

    def on_call(n: int) -> None:
        calls[0] = n
        if n == 40:
            refusing.on = True  # the disk fills under a running batch

    attach = svc.attach
    svc.attach = lambda decide, *rest: attach(Counted(decide, on_call), *rest)  # type: ignore[method-assign]
    app = create_app(engines, ApiSettings(metrics=True), batches=svc)
    with TestClient(app) as client:
        assert metric(client, "basal_batches_store_writable") == 1
        refusing.on = True
        error = refused(upload(client, jsonl(3)), root, tmp_path)
        assert "no space left" in error["message"]
        refusing.on = False
        file = upload(client, jsonl(LINES)).json()
        batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/basal",
                                                 "completion_window": "24h"}).json()  # fmt: skip
        wait(lambda: svc.fault.paused == batch["id"] and svc.fault.failures >= 3, "the batch pauses")
        ready = client.get("/health/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        reason = ready.json()["degraded"]["batches"]
        assert reason == "batch work is paused: no space left on the store's disk" and str(root) not in reason
        assert metric(client, "basal_batches_store_writable") == 0
        assert metric(client, "basal_batches_paused") == 1
        failures = metric(client, "basal_batches_store_write_failures_total")
        assert failures >= 3
        shown = client.get(f"/v1/batches/{batch['id']}").json()
        assert shown["status"] == "in_progress" and shown["errors"]["data"][0]["code"] == "store_unwritable"
        assert "/" not in shown["errors"]["data"][0]["message"]
        assert client.get("/v1/batches").json()["data"][0]["errors"] == shown["errors"]
        online = client.post("/v1/basal", json=json.loads(jsonl(1))["body"])
        assert online.status_code == 200  # decisions need no store
        computed = calls[0]
        wait(lambda: svc.fault.failures >= failures + 3, "three more tries")
        assert calls[0] == computed < LINES  # no line sent while the store refuses
        assert metric(client, "basal_batches_store_write_failures_total") > failures
        refusing.on = False
        wait(lambda: client.get(f"/v1/batches/{batch['id']}").json()["status"] == "completed", "it completes")
        done = client.get(f"/v1/batches/{batch['id']}").json()
        assert done["errors"] is None and done["request_counts"]["completed"] == LINES
        assert client.get("/health/ready").json()["status"] == "ok"
        assert "degraded" not in client.get("/health/ready").json()
        assert metric(client, "basal_batches_store_writable") == 1
        assert metric(client, "basal_batches_paused") == 0
        records = client.get(f"/v1/files/{done['output_file_id']}/content").content.splitlines()
        assert sorted(json.loads(r)["custom_id"] for r in records) == sorted(f"c{i}" for i in range(LINES))
    assert calls[0] == LINES  # each line computed once


def test_a_store_error_on_any_files_route_is_a_507_without_a_path(engines, tmp_path, monkeypatch):
    root = tmp_path / "store"
    svc = BatchService(open_store(root), BatchSettings(root=root))
    with TestClient(create_app(engines, ApiSettings(), batches=svc)) as client:
        file = upload(client, jsonl(2)).json()

        def eacces(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(root / "files" / f"{file['id']}.jsonl"))

        monkeypatch.setattr(os, "replace", eacces)  # the upload's rename into place
        assert "not writable" in refused(upload(client, jsonl(2)), root)["message"]
        monkeypatch.undo()
        monkeypatch.setattr(Path, "unlink", eacces)  # a delete on a read-only volume
        refused(client.delete(f"/v1/files/{file['id']}"), root)


def test_an_upload_to_a_really_full_disk_is_a_507_then_works_once_freed(engines, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = (
        os.geteuid() == 0
        and not subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
        ).returncode
    )
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): the injected faults cover it")
    try:
        root = disk / "store"
        svc = BatchService(open_store(root), BatchSettings(root=root))
        with TestClient(create_app(engines, ApiSettings(), batches=svc)) as client:
            filler = fill(disk)
            refused(upload(client, jsonl(50)), root, disk)
            assert [p.name for p in (root / "files").iterdir()] == []  # the partial upload is gone
            filler.unlink()
            assert upload(client, jsonl(50)).status_code == 200
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_connection_error_is_the_clients_not_the_stores(engines, tmp_path, monkeypatch):
    """An upload whose client resets the connection is not a store fault: no 507, readiness stays ok."""
    root = tmp_path / "store"
    svc = BatchService(open_store(root), BatchSettings(root=root))
    with TestClient(create_app(engines, ApiSettings(), batches=svc)) as client:

        async def reset(*args, **kwargs):
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

        monkeypatch.setattr("basal.api.routes.batches.read_upload", reset)
        assert upload(client, jsonl(2)).status_code == 499
        assert svc.fault.reason is None and client.get("/health/ready").json()["status"] == "ok"


def test_a_read_only_files_volume_pauses_finalizing_and_refuses_uploads(engines, tmp_path):
    """The store's files directory really read-only (a read-only bind mount over it; the database stays writable):
    an upload is a 507 that says so, a batch whose lines ran cannot write its output and waits (degraded), and
    completes once the volume is writable again."""
    root = tmp_path / "store"
    svc = BatchService(open_store(root), BatchSettings(root=root))
    files = root / "files"
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(files), str(files)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (not root, or no CAP_SYS_ADMIN): the injected faults cover it")
    try:
        with TestClient(create_app(engines, ApiSettings(metrics=True), batches=svc)) as client:
            file = upload(client, jsonl(20)).json()
            subprocess.run(["mount", "-o", "remount,bind,ro", str(files)], check=True)
            error = refused(upload(client, jsonl(3)), root)
            assert "read-only" in error["message"]
            batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/basal",
                                                     "completion_window": "24h"}).json()  # fmt: skip
            wait(lambda: svc.fault.failures >= 3 and svc.store.get_batch(batch["id"])["status"] == "finalizing",
                 "its output cannot be written")  # fmt: skip
            ready = client.get("/health/ready").json()
            assert ready["status"] == "degraded" and "read-only" in ready["degraded"]["batches"]
            assert client.get(f"/v1/batches/{batch['id']}").json()["errors"]["data"][0]["code"] == "store_unwritable"
            subprocess.run(["mount", "-o", "remount,bind,rw", str(files)], check=True)  # writable again
            wait(lambda: client.get(f"/v1/batches/{batch['id']}").json()["status"] == "completed", "it completes")
            wait(lambda: client.get("/health/ready").json()["status"] == "ok", "ready says ok again")
            assert metric(client, "basal_batches_store_writable") == 1
            done = client.get(f"/v1/batches/{batch['id']}").json()
            assert done["request_counts"]["completed"] == 20 and done["errors"] is None
            assert client.get(f"/v1/files/{done['output_file_id']}/content").content.count(b"\n") == 20
    finally:
        subprocess.run(["umount", "-l", str(files)], capture_output=True)
