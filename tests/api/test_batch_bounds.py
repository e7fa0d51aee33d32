"""The Files and Batches API at its edges: lines the JSON decoder cannot read in every way it fails (nesting past
its depth, numbers out of range, not UTF-8) are error records, never a 500; a byte order mark is skipped; every
error body is bounded by `limits.max_echo_chars` whatever it quotes; a list cursor that names nothing is a 400."""

from __future__ import annotations

import json

import httpx
import pytest
from basal_client import BasalClient

from basal.api.settings import ApiSettings
from basal.core.request.limits import Limits
from tests.api.test_batches import requests_, service
from tests.servers import live_server, make_engines

ECHO = 50


@pytest.fixture(scope="module")
def live(demo_model, tmp_path_factory):
    engines = make_engines(demo_model)
    svc = service(tmp_path_factory.mktemp("batches"), max_upload_bytes=4 << 20, max_lines=50, max_line_bytes=1 << 20)
    settings = ApiSettings(limits=Limits(max_echo_chars=ECHO))
    with live_server(engines, batches=svc, settings=settings) as url:
        yield url


def _line(custom_id: str, body: object = None) -> bytes:
    body = requests_(1, 1)[0]["body"] if body is None else body
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/basal", "body": body}).encode()


def test_lines_the_decoder_cannot_read_are_error_records_not_a_500(live):
    nested = b'{"custom_id":"%s","method":"POST","url":"/v1/basal","body":{"state":%s,"questions":{}}}'
    lines = [
        b"\xef\xbb\xbf" + _line("first"),  # a BOM before line 1: skipped
        nested % (b"deep", b"[" * 1000 + b"]" * 1000),  # ~1,000 levels: past the decoder's depth
        b"[" * 100_000 + b"]" * 100_000,
        b'{"custom_id":"huge","method":"POST","url":"/v1/basal","body":{"n":' + b"9" * 5000 + b"}}",
        b'{"custom_id":"\xff\xfe","method":"POST"}',
        json.dumps({"custom_id": "many", **{f"k{i}": 1 for i in range(2000)}}).encode(),
        nested % (b"mid", b"[" * 200 + b"]" * 200),  # read, then refused as online refuses it (64 levels)
        _line("last"),
    ]
    with BasalClient(live) as client:
        file = client.files.create(b"\n".join(lines) + b"\n")
        done = client.batches.wait(
            client.batches.create(input_file_id=file["id"])["id"], timeout=60, poll_interval=0.05
        )
        records = {r["custom_id"]: r for r in client.batches.results(done["id"])}
    assert done["status"] == "completed" and done["request_counts"]["total"] == 8
    assert records["first"]["response"]["status_code"] == 200 and records["last"]["response"]["status_code"] == 200
    for n in (2, 3):
        assert records[f"line:{n}"]["error"] == {
            "code": "invalid_json",
            "message": f"line {n} is nested too deeply to be read",
        }
    assert records["line:4"]["error"]["code"] == "invalid_json"  # an integer out of range (ValidationError)
    assert records["line:5"]["error"]["code"] == "invalid_json"  # not UTF-8
    assert records["many"]["error"]["code"] == "invalid_request" and len(records["many"]["error"]["message"]) < 300
    body = lines[6][lines[6].index(b'"body":') + 7 : -1]
    online = httpx.post(f"{live}/v1/basal", content=body, headers={"content-type": "application/json"})
    assert records["mid"]["response"]["status_code"] == online.status_code == 422
    assert records["mid"]["response"]["body"] == online.json()


@pytest.mark.parametrize(
    ("method", "path", "kw", "status"),
    [
        ("GET", "/v1/files/file-" + "x" * 30_000, {}, 404),
        ("GET", "/v1/batches/batch_" + "x" * 30_000, {}, 404),
        ("DELETE", "/v1/files/file-" + "x" * 30_000, {}, 404),
        ("GET", "/v1/files/file-" + "x" * 30_000 + "/content", {}, 404),
        ("POST", "/v1/batches/batch_" + "x" * 30_000 + "/cancel", {}, 404),
        (
            "POST",
            "/v1/batches",
            {"json": {"input_file_id": "f" * 1_000_000, "endpoint": "/v1/basal", "completion_window": "24h"}},
            404,
        ),
        ("POST", "/v1/batches", {"json": {"input_file_id": 1, "endpoint": "x" * 100_000}}, 400),
        ("GET", "/v1/files?after=" + "a" * 30_000, {}, 400),
    ],
    ids=["file", "batch", "delete", "content", "cancel", "create", "invalid body", "cursor"],
)
def test_every_error_body_is_bounded(live, method, path, kw, status):
    r = httpx.request(method, live + path, **kw)
    assert r.status_code == status, r.text[:300]
    assert len(r.content) < ECHO + 400, r.text[:300]
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("route", ["/v1/files", "/v1/batches"])
def test_an_unknown_cursor_is_refused(live, route):
    r = httpx.get(f"{live}{route}?after=nothing-of-that-name")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_cursor"
    assert r.json()["error"]["message"].startswith("after='nothing-of-that-name' names nothing in this list")
    with BasalClient(live) as client:
        client.files.create(_line("a") + b"\n")
        client.files.create(_line("b") + b"\n")
        first = httpx.get(f"{live}/v1/files?limit=1").json()
        assert first["has_more"] is True
        second = httpx.get(f"{live}/v1/files?limit=1&after={first['last_id']}")  # a real cursor still pages
        assert second.status_code == 200 and second.json()["data"][0]["id"] != first["last_id"]
