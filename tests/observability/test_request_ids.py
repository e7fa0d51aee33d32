"""Request ids end to end: the client's id when sane (else a generated one), echoed on every response, and on every
log line of its request — success, 4xx and the 500 of a fault injected in a test backend — in JSON and text logs."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.observability.logs import formatter
from tests.api.test_http import REQUEST, post
from tests.stub_backend import FakeBackend


class FaultyBackend(FakeBackend):
    """Every forward fails: the path of a device fault or a bug, which must answer 500 and log it."""

    def prefix(self, key, tokens):
        return None

    def run(self, batch, prepared=None, preemptible=False):
        raise RuntimeError("injected fault")
        yield  # a pass is a generator


@contextmanager
def captured(kind: str = "json") -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(kind))  # type: ignore[arg-type]
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict]:
    """The server's lines (not the test client's own: httpx logs each request it sends)."""
    return [x for x in map(json.loads, stream.getvalue().splitlines()) if x["logger"] != "httpx"]


@pytest.fixture(scope="module")
def logged(engines):
    with TestClient(create_app(engines, ApiSettings(access_log=True))) as c:
        yield c


@pytest.fixture(scope="module")
def faulty(demo_model):
    metrics = Metrics()
    engine = Engine(demo_model.name, Pipeline(demo_model, FaultyBackend()), Gate(), metrics)
    with TestClient(create_app(Engines({demo_model.name: engine}, demo_model.name, metrics), ApiSettings(
        access_log=True))) as c:  # fmt: skip
        yield c


def test_the_clients_id_is_echoed_and_on_every_line_of_a_success_and_a_4xx(logged):
    for rid, body, status in (
        ("client-ok-1", REQUEST, 200),
        ("client-bad-2", {**REQUEST, "questions": {}}, 422),
    ):
        with captured() as out:
            r = post(logged, body, **{"x-request-id": rid})
        assert r.status_code == status
        assert r.headers["x-request-id"] == rid and r.headers["x-typesafe-request-id"] == rid
        records = lines(out)
        access = [x for x in records if x["logger"] == "basal.access"]
        assert len(access) == 1 and access[0]["status"] == status and access[0]["path"] == "/v1/systemone"
        assert access[0]["method"] == "POST" and access[0]["duration_ms"] >= 0
        if status == 200:
            assert access[0]["model"] == "basal-synthetic-demo" and access[0]["compute_ms"] > 0
        assert records and all(x["request_id"] == rid for x in records), records


def test_the_500_of_an_injected_fault_carries_the_id_on_every_line(faulty):
    with captured() as out:
        r = post(faulty, REQUEST, **{"x-typesafe-request-id": "sdk-0042"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "sdk-0042"
    records = lines(out)
    mine = [x for x in records if x.get("request_id") == "sdk-0042"]
    assert any("internal error" in x["message"] and "injected fault" in x["exc_info"] for x in mine)
    assert any("its pass of 1 requests failed" in x["message"] for x in mine)  # logged on the lane's thread
    assert any(x["logger"] == "basal.access" and x["status"] == 500 for x in mine)
    # the only line without the id is the lane's traceback of the pass, which may hold several requests
    assert [x["message"] for x in records if "request_id" not in x] == ["a pass of 1 requests failed"]


@pytest.mark.parametrize(
    "unsafe",
    ["x" * 129, "has space", "semi;colon", "<script>", "caf\u00e9", "", "a,b"],
)
def test_an_unsafe_id_is_replaced_and_never_echoed_or_logged(logged, unsafe):
    with captured() as out:
        r = logged.post(
            "/v1/systemone",
            content=json.dumps(REQUEST).encode(),
            headers=[("content-type", "application/json"), ("x-request-id", unsafe.encode("latin-1"))],
        )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", rid) and r.headers["x-typesafe-request-id"] == rid
    assert unsafe == "" or unsafe not in out.getvalue()
    assert all(x["request_id"] == rid for x in lines(out))


def test_every_response_carries_an_id_and_generated_ids_differ(logged):
    ids = {logged.get(path).headers["x-request-id"] for path in ("/health", "/nowhere", "/v1/models", "/health")}
    assert len(ids) == 4 and all(i.startswith("req_") for i in ids)
    assert logged.get("/health", headers={"x-request-id": "probe-7"}).headers["x-request-id"] == "probe-7"


def test_text_lines_have_a_utc_timestamp_and_the_id(logged):
    with captured("text") as out:
        post(logged, REQUEST, **{"x-request-id": "t-1"})
    (line,) = [x for x in out.getvalue().splitlines() if " basal.access: " in x]
    assert re.match(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO basal\.access: .*POST /v1/systemone 200 .* \[t-1\]$", line
    )


def test_a_path_with_a_newline_stays_one_access_line(logged):
    with captured("text") as out:
        logged.get("/a%0aFAKE 200")
    (line,) = [x for x in out.getvalue().splitlines() if " httpx: " not in x]
    assert "GET /a\\x0aFAKE 200 404" in line


def test_json_lines_have_each_seconds_own_time_and_keep_odd_values():

    class Odd:
        def __str__(self) -> str:
            return "odd"

    fmt = formatter("json")
    lines = []
    for created in (1_800_000_000.25, 1_800_000_000.5, 1_800_000_001.75, 1_800_000_000.125):
        record = logging.LogRecord("basal.access", logging.INFO, __file__, 1, "m %s", ("é",), None)
        record.created, record.msecs = created, (created % 1) * 1000
        record.model, record.status = Odd(), 2**70  # str() of the unknown; a big int
        lines.append(json.loads(fmt.format(record)))
    assert [x["time"] for x in lines] == [
        "2027-01-15T08:00:00.250Z",
        "2027-01-15T08:00:00.500Z",
        "2027-01-15T08:00:01.750Z",
        "2027-01-15T08:00:00.125Z",
    ]
    assert lines[0]["message"] == "m é" and lines[0]["status"] == 2**70 and lines[0]["model"] == "odd"
