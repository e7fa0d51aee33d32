"""The Files and Batches API with the official native SDK, basal-client 0.6.0, against a live server on loopback:
BasalClient and AsyncBasalClient, upload / create(requests=) / wait / results, list, retrieve, cancel, delete,
idempotent replay and the 409, error records, the limits, expiry with a fake clock, and answers byte for byte
those of POST /v1/basal. Every test runs on both stores: SQLite and a real PostgreSQL (tests/postgres.py)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
from basal_client import AsyncBasalClient, BasalClient, BasalHTTPError

from basal.batch.service import BatchService, BatchSettings
from basal.batch.store import open_store
from tests.postgres import KINDS, database_for
from tests.servers import live_server, make_engines

LATENCY = re.compile(rb'"latency_ms":[0-9.eE+-]+')


class Clock:
    def __init__(self):
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def requests_(n_states: int, per_state: int, tag: str = "") -> list[dict]:
    return [
        {
            "custom_id": f"{tag}s{s}-q{q}",
            "body": {
                "state": f"Ticket {s}: the parcel {s} arrived damaged and the refund is late.",
                "questions": {f"q{q}": {"type": "noul", "instructions": f"Is point {q} about money?"}},
            },
        }
        for s in range(n_states)
        for q in range(per_state)
    ]


def service(root, database, clock=None, **limits) -> BatchService:
    settings = BatchSettings(root=root, database=database, **limits)
    return BatchService(open_store(root, database, clock or time.time), settings)


@pytest.fixture(scope="module", params=KINDS)
def live(demo_model, tmp_path_factory, request):
    engines = make_engines(demo_model)
    svc = service(
        tmp_path_factory.mktemp("batches"),
        database_for(request.param, request),
        max_upload_bytes=64_000,
        max_lines=200,
        max_line_bytes=2000,
        max_active=4,
    )
    with live_server(engines, batches=svc) as url:
        yield url


def body_bytes(record: bytes) -> bytes:
    """The `response.body` of a record, as the bytes the server wrote."""
    start = record.index(b'"body":') + len(b'"body":')
    return record[start : record.rindex(b'},"error":null}')]


def test_the_sdk_batch_example_runs_and_answers_equal_online(live):
    reqs = requests_(4, 5)
    with BasalClient(live) as client:
        batch = client.batches.create(requests=reqs, metadata={"job": "tickets"})
        assert batch["status"] == "validating" and batch["endpoint"] == "/v1/basal"
        done = client.batches.wait(batch["id"], timeout=60, poll_interval=0.05)
        assert done["status"] == "completed" and done["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
        assert done["metadata"] == {"job": "tickets"} and done["error_file_id"] is None
        assert done["in_progress_at"] is not None and done["completed_at"] >= done["in_progress_at"]
        records = list(client.batches.results(batch["id"]))
        assert sorted(r["custom_id"] for r in records) == sorted(r["custom_id"] for r in reqs)
        raw = client.files.content(done["output_file_id"]).splitlines()
        assert client.files.content(done["input_file_id"]).count(b"\n") == 20
        assert client.decide(reqs[0]["body"])["model"] == "basal-synthetic-demo"
        assert client.models()["models"][0]["name"] == "basal-synthetic-demo"
    by_id = {json.loads(line)["custom_id"]: line for line in raw}
    for r in reqs:  # each body byte for byte what POST /v1/basal answers (its latency aside)
        online = httpx.post(f"{live}/v1/basal", json=r["body"]).content
        assert LATENCY.sub(b"", body_bytes(by_id[r["custom_id"]])) == LATENCY.sub(b"", online)


def test_list_retrieve_cancel_delete_and_idempotency(live):
    with BasalClient(live) as client:
        file = client.files.create(b"".join(json.dumps({**r, "method": "POST", "url": "/v1/basal"}).encode() + b"\n"
                                            for r in requests_(1, 2, "i")), filename="tickets.jsonl")  # fmt: skip
        assert file["filename"] == "tickets.jsonl" and file["purpose"] == "batch" and file["status"] == "processed"
        assert client.files.retrieve(file["id"]) == file
        first = client.batches.create(input_file_id=file["id"], idempotency_key="job-1")
        assert client.batches.create(input_file_id=file["id"], idempotency_key="job-1")["id"] == first["id"]
        with pytest.raises(BasalHTTPError) as conflict:
            client.batches.create(input_file_id=file["id"], idempotency_key="job-1", metadata={"other": "data"})
        assert conflict.value.status_code == 409 and conflict.value.body["error"]["code"] == "idempotency_conflict"
        done = client.batches.wait(first["id"], timeout=60, poll_interval=0.05)
        assert client.batches.cancel(first["id"]) == done  # a terminal batch comes back unchanged
        page = client.batches.list(limit=1)
        assert page["data"][0]["id"] == page["last_id"] == first["id"]
        assert page["has_more"] == (len(client.batches.list(limit=100)["data"]) > 1)
        older = client.batches.list(after=page["last_id"], limit=100)
        assert first["id"] not in [b["id"] for b in older["data"]]
        outputs = client.files.list(purpose="batch_output")
        assert done["output_file_id"] in [f["id"] for f in outputs["data"]]
        assert client.files.delete(file["id"]) == {"id": file["id"], "object": "file", "deleted": True}
        for call in (lambda: client.files.retrieve(file["id"]), lambda: client.batches.retrieve("batch_nope")):
            with pytest.raises(BasalHTTPError) as missing:
                call()
            assert missing.value.status_code == 404


def test_the_async_client(live):
    async def main():
        async with AsyncBasalClient(live) as client:
            reqs = requests_(2, 3, "a")
            batch = await client.batches.create(requests=reqs, idempotency_key="async-1")
            done = await client.batches.wait(batch["id"], timeout=60, poll_interval=0.05)
            records = [r async for r in client.batches.results(batch["id"])]
            again = await client.batches.retrieve(batch["id"])
            listed = await client.files.list(limit=100)
            return done, records, again, listed

    done, records, again, listed = asyncio.run(main())
    assert done["status"] == "completed" and len(records) == 6 and again == done
    assert done["input_file_id"] in [f["id"] for f in listed["data"]]


def test_unreadable_and_refused_lines_become_error_records(live):
    good = {"method": "POST", "url": "/v1/basal", "body": requests_(1, 1)[0]["body"]}
    lines = [
        json.dumps({"custom_id": "ok", **good}).encode(),
        b"{broken",
        json.dumps({"custom_id": "wrong-url", **good, "url": "/v1/systemone"}).encode(),
        json.dumps({"custom_id": "big", **good, "body": {"state": "x" * 3000, "questions": {}}}).encode(),
        json.dumps({"custom_id": "invalid", **good, "body": {"state": "s"}}).encode(),  # no questions: 422
    ]
    with BasalClient(live) as client:
        file = client.files.create(b"\n".join(lines) + b"\n")
        done = client.batches.wait(
            client.batches.create(input_file_id=file["id"])["id"], timeout=60, poll_interval=0.05
        )
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 5, "completed": 1, "failed": 4}
        records = {r["custom_id"]: r for r in client.batches.results(done["id"])}
    assert records["ok"]["response"]["status_code"] == 200
    assert records["line:2"]["error"]["code"] == "invalid_json"
    assert records["wrong-url"]["error"]["code"] == "invalid_request"
    assert records["big"]["error"]["code"] == "line_too_large"
    invalid = records["invalid"]["response"]
    assert invalid["status_code"] == 422
    online = httpx.post(f"{live}/v1/basal", json={"state": "s"})
    assert (online.status_code, online.json()) == (422, invalid["body"])


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b"", 400, "invalid_file"),
        (b'{"custom_id":"a","method":"POST","url":"/v1/basal","body":{}}\n' * 2, 400, "invalid_file"),
        (b"a,b\n1,2\n", 400, "invalid_file"),
        (b'{"custom_id":"a"}\n' * 201, 400, "invalid_file"),
        (b"x" * 70_000, 413, "file_too_large"),
    ],
    ids=["empty", "custom_id twice", "not jsonl", "too many lines", "too large"],
)
def test_malformed_uploads_are_refused(live, content, status, code):
    with BasalClient(live) as client, pytest.raises(BasalHTTPError) as refused:
        client.files.create(content)
    assert refused.value.status_code == status and refused.value.body["error"]["code"] == code


@pytest.mark.parametrize(
    ("method", "path", "kw", "status"),
    [
        ("POST", "/v1/files", {"content": b"{}", "headers": {"content-type": "application/json"}}, 415),
        (
            "POST",
            "/v1/batches",
            {"json": {"input_file_id": "file-x", "endpoint": "/v1/chat", "completion_window": "24h"}},
            400,
        ),
        (
            "POST",
            "/v1/batches",
            {"json": {"input_file_id": "file-x", "endpoint": "/v1/basal", "completion_window": "1h"}},
            400,
        ),
        (
            "POST",
            "/v1/batches",
            {"json": {"input_file_id": "file-x", "endpoint": "/v1/basal", "completion_window": "24h"}},
            404,
        ),
        ("POST", "/v1/batches", {"content": b"{", "headers": {"content-type": "application/json"}}, 400),
        ("POST", "/v1/batches", {"json": {}, "headers": {"idempotency-key": "bad key"}}, 400),
        ("GET", "/v1/files?limit=0", {}, 400),
        ("GET", "/v1/batches?limit=101", {}, 400),
        ("GET", "/v1/files?purpose=fine-tune", {}, 400),
        ("GET", "/v1/files/file-nope/content", {}, 404),
        ("POST", "/v1/batches/batch_nope/cancel", {}, 404),
        ("DELETE", "/v1/files/file-nope", {}, 404),
    ],
)
def test_bad_requests_get_a_clear_status(live, method, path, kw, status):
    r = httpx.request(method, live + path, **kw)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_expires_after_is_checked_and_kept(live):
    with BasalClient(live) as client:
        f = client.files.create(b'{"custom_id":"a","method":"POST","url":"/v1/basal","body":{}}\n',
                                expires_after={"anchor": "created_at", "seconds": 3600})  # fmt: skip
        assert f["expires_at"] == f["created_at"] + 3600
        with pytest.raises(BasalHTTPError) as short:
            client.files.create(b"{}\n", expires_after={"anchor": "created_at", "seconds": 60})
        assert short.value.status_code == 400 and short.value.body["error"]["param"] == "expires_after[seconds]"


@pytest.fixture
def slow(demo_model, tmp_path, database):
    """A server whose passes are slow (a pause at every layer), with a fake clock: batches stay in progress."""
    engines = make_engines(demo_model, slow_s=0.02)
    clock = Clock()
    svc = service(tmp_path, database, clock, max_active=1, window=4)
    with live_server(engines, batches=svc) as url:
        yield url, clock, svc


def _wait_for(check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cancel_keeps_what_finished_and_stops_new_lines(slow):
    url, _, svc = slow
    with BasalClient(url) as client:
        batch = client.batches.create(requests=requests_(20, 3))
        _wait_for(lambda: client.batches.retrieve(batch["id"])["request_counts"]["completed"] >= 2)
        with pytest.raises(BasalHTTPError) as busy:  # max_active 1: a second batch waits its turn
            client.batches.create(input_file_id=batch["input_file_id"])
        assert busy.value.status_code == 429
        cancelling = client.batches.cancel(batch["id"])
        assert cancelling["status"] in ("cancelling", "cancelled") and cancelling["cancelling_at"] is not None
        done = client.batches.wait(batch["id"], timeout=60, poll_interval=0.05)
        records = list(client.batches.results(batch["id"]))
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    assert 2 <= done["request_counts"]["completed"] < 60 == done["request_counts"]["total"]
    assert len(records) == len({r["custom_id"] for r in records}) == done["request_counts"]["completed"]
    assert len(svc.store.done_lines(batch["id"])) == len(records)  # nothing was recorded after the cancel


def test_a_batch_expires_after_its_window_with_partial_results(slow):
    url, clock, _ = slow
    with BasalClient(url) as client:
        batch = client.batches.create(requests=requests_(20, 3, "e"))
        assert batch["expires_at"] == batch["created_at"] + 86400
        _wait_for(lambda: client.batches.retrieve(batch["id"])["request_counts"]["completed"] >= 1)
        clock.t += 86400
        done = client.batches.wait(batch["id"], timeout=60, poll_interval=0.05)
        records = list(client.batches.results(batch["id"]))
    assert done["status"] == "expired" and done["expired_at"] == int(clock.t)
    assert 1 <= len(records) == done["request_counts"]["completed"] < 60


def test_the_openapi_document_has_the_batch_routes(live):
    from tests.api.test_openapi_docs import references

    document = httpx.get(f"{live}/schema/openapi.json").json()
    paths = document["paths"]
    assert {
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
    } <= set(paths)
    upload = paths["/v1/files"]["post"]
    assert list(upload["requestBody"]["content"]) == ["multipart/form-data"]
    assert {"200", "400", "413", "415"} <= set(upload["responses"])
    assert {"200", "404", "409", "429"} <= set(paths["/v1/batches"]["post"]["responses"])
    batch = paths["/v1/batches/{batch_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert "request_counts" in batch["properties"]
    assert not [r for r in references(document) if not r.startswith("#/")]


def test_a_batch_waiting_behind_another_is_cancelled_at_once(demo_model, tmp_path, database):
    engines = make_engines(demo_model, slow_s=0.02)
    with live_server(engines, batches=service(tmp_path, database, window=4)) as url, BasalClient(url) as client:
        running = client.batches.create(requests=requests_(20, 3, "r"))
        waiting = client.batches.create(requests=requests_(2, 2, "w"))
        _wait_for(lambda: client.batches.retrieve(running["id"])["request_counts"]["completed"] >= 1)
        cancelled = client.batches.cancel(waiting["id"])
        assert cancelled["status"] == "cancelled" and cancelled["request_counts"]["completed"] == 0
        assert client.batches.retrieve(running["id"])["status"] == "in_progress"
        client.batches.cancel(running["id"])
        assert client.batches.wait(running["id"], timeout=60, poll_interval=0.05)["status"] == "cancelled"


def test_a_batch_whose_input_file_is_gone_fails_with_its_reason(slow):
    url, _, svc = slow
    row, _ = svc.store.create_batch("file-gone", "/v1/basal", 86400, "24h", None, None, None, 1)  # picked up within 1 s
    with BasalClient(url) as client:
        done = client.batches.wait(row["id"], timeout=60, poll_interval=0.05)
        assert list(client.batches.results(row["id"])) == []
    assert done["status"] == "failed" and done["failed_at"] is not None
    assert done["errors"]["data"][0]["code"] == "invalid_input_file"
    assert done["errors"]["data"][0]["param"] == "input_file_id"
    message = done["errors"]["data"][0]["message"]
    assert "file-gone" in message and "/" not in message  # the id, never the store's path on the server


def test_a_batch_line_runs_under_its_record_request_id(demo_model):
    """The id in a line's record is the request id its log lines carry (the lanes copy the task's context)."""
    from basal.api.decide import body_decider
    from basal.api.settings import ApiSettings
    from basal.observability.logs import REQUEST_ID

    engines = make_engines(demo_model)
    seen: list[str | None] = []
    run = engines.run

    async def recording_run(*args, **kwargs):
        seen.append(REQUEST_ID.get())
        return await run(*args, **kwargs)

    engines.run = recording_run
    engines.start()
    try:
        decide = body_decider(engines, ApiSettings())
        body = json.dumps(requests_(1, 1)[0]["body"]).encode()
        status, _, rid = asyncio.run(decide(body, lambda: False))
    finally:
        engines.close(drain=False)
    assert status == 200 and seen == [rid] and rid.startswith("req_")
    assert REQUEST_ID.get() is None  # reset after the line
