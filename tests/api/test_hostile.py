"""Cheap requests a hostile user sends: each answered with the right status within its time budget, /health
answering meanwhile, and the server's memory growth bounded (the server runs in this process)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlparse

import httpx
import pytest

from basal.api.settings import ApiSettings
from basal.core.request.limits import Limits
from tests.servers import live_server, make_engines

CASE_BUDGET_S = 10.0  # today's defects took 46 s to 15 min; every case here ends in well under a second
HEALTH_BUDGET_S = 3.0  # /health polled during each case: the event loop never freezes for longer
LIMITS = Limits(max_questions=64, max_request_tokens=20_000, max_errors=16, max_echo_chars=100)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture(scope="module")
def hostile(demo_model):
    with live_server(make_engines(demo_model, limits=LIMITS), ApiSettings(metrics=True, limits=LIMITS)) as url:
        httpx.get(f"{url}/health")
        before = rss_bytes()
        yield url
        assert rss_bytes() - before < 600 << 20  # the whole suite: bounded, not gigabytes


@contextmanager
def health_watch(url: str):
    """Poll /health while the case runs; fail if one answer took longer than HEALTH_BUDGET_S."""
    worst, stop = [0.0], threading.Event()

    def poll():
        with httpx.Client(timeout=HEALTH_BUDGET_S * 3) as client:
            while not stop.is_set():
                t = time.monotonic()
                assert client.get(f"{url}/health").status_code == 200
                worst[0] = max(worst[0], time.monotonic() - t)
                time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    assert worst[0] < HEALTH_BUDGET_S, f"/health took {worst[0]:.1f} s during the case"


def post(url: str, body, path: str = "/v1/systemone", **headers) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **headers}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=CASE_BUDGET_S)


def choices(n: int) -> dict:
    return {f"option {i}": f"the description of option {i}" for i in range(n)}


WORDS = "zamówienie dotarło uszkodzone proszę o zwrot pieniędzy "


CASES = [
    (  # item 1: 20k options, quadratic before its limit was checked
        "/v1/basal",
        {"state": "x", "questions": {"q": {"type": "choice", "criteria": choices(20_000)}}},
        422,
        lambda b: b == {"error": "question 'q': 20000 options (supported: 2..10)"},
    ),
    (
        "/v1/systemone",
        {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "choice", "criteria": choices(20_000)}}},
        400,
        lambda b: b == {"detail": "Too many choices. Must have at most 255 choices."},
    ),
    (  # item 2: a 6 MiB state is refused by its length, before it is tokenized
        "/v1/systemone",
        {"model": "jev-latest", "state": "a" * (6 << 20), "questions": {"q": {"type": "noul", "instructions": "?"}}},
        400,
        lambda b: b["detail"]["error_type"] == "max_tokens_exceeded",
    ),
    (
        "/v1/basal",
        {"state": "a" * (6 << 20), "questions": {"q": {"type": "noul", "instructions": "?"}}},
        422,
        lambda b: "characters" in b["error"],
    ),
    (  # item 3: questions per request
        "/v1/systemone",
        {"model": "jev-latest", "state": "x", "questions": {f"q{i}": {"type": "noul"} for i in range(65)}},
        400,
        lambda b: b == {"detail": "Too many questions. Must have at most 64 questions."},
    ),
    (
        "/v1/basal",
        {"state": "x", "questions": {f"q{i}": {"type": "noul"} for i in range(65)}},
        422,
        lambda b: b == {"error": "65 questions; a request may ask at most 64"},
    ),
    (  # item 3: packed tokens per request
        "/v1/systemone",
        {
            "model": "jev-latest",
            "state": "x",
            "questions": {f"q{i}": {"type": "noul", "instructions": f"{i} {WORDS * 30}"} for i in range(40)},
        },
        400,
        lambda b: b["detail"]["error_type"] == "max_tokens_exceeded" and "20000" in b["detail"]["message"],
    ),
    (  # item 8: error lists and echoes are capped
        "/v1/systemone",
        {"state": "x", "questions": {f"q{i}" * 50: {"type": "noul", "bad": "y" * 10_000} for i in range(60)}},
        422,
        lambda b: (
            len(b["detail"]) == 17 and b["detail"][-1]["type"] == "too_many_errors" and len(json.dumps(b)) < 16 * 500
        ),
    ),
    (
        "/v1/basal",
        {"model": "m" * 100_000, "state": "x", "questions": {}},
        422,
        lambda b: b["error"].startswith("unknown model: mmm") and len(b["error"]) < 300,  # + the served names
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "check"), CASES)
def test_hostile_request_is_refused_quickly(hostile, path, body, status, check):
    with health_watch(hostile):
        r = post(hostile, body, path)
    assert r.status_code == status and check(r.json()), r.text[:500]
    assert len(r.content) < 20_000


def test_gzip_bomb_is_413_and_the_loop_keeps_answering(hostile):
    bomb = gzip.compress(b"\0" * (32 << 20), compresslevel=1)
    with health_watch(hostile):
        r = post(hostile, bomb, **{"content-encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x", None])
@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/basal"])
def test_only_json_is_read(hostile, content_type, path):
    """item 13: a web page cannot make a browser spend this server's compute with a "simple" request."""
    body = json.dumps({"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}})
    body = body.encode()
    headers = {"content-type": content_type} if content_type else {}
    r = httpx.post(f"{hostile}{path}", content=body, headers=headers, timeout=CASE_BUDGET_S)
    assert r.status_code == 415, r.text
    message = r.json()["error" if path == "/v1/basal" else "detail"]
    assert "application/json" in message
    assert post(hostile, body, path, **{"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_no_cors_by_default(hostile):
    r = httpx.options(
        f"{hostile}/v1/systemone",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        timeout=CASE_BUDGET_S,
    )
    assert "access-control-allow-origin" not in r.headers


def test_hang_up_during_upload_is_counted_apart_from_server_errors(hostile):
    """item 9: a client that leaves mid-body is 499 in /metrics, never a 500."""
    address = (urlparse(hostile).hostname, urlparse(hostile).port)
    head = b"POST /v1/basal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{"
    with socket.create_connection(address) as s:
        s.sendall(head)
        time.sleep(0.2)
    deadline = time.monotonic() + CASE_BUDGET_S
    while 'status="499"' not in (text := httpx.get(f"{hostile}/metrics").text):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    assert 'status="500"' not in text


def test_non_ascii_authorization_is_401(demo_model):
    """item 5: any header bytes are a wrong key, compared in constant time on bytes."""
    with live_server(make_engines(demo_model), ApiSettings(api_keys=("s3cret",))) as url:
        body = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
        for key in (b"Bearer \xff\xfe\x80", b"Bearer s3cr\xc3\xa9t", b"\xe9\xe9"):
            r = post(url, body, authorization=key)
            assert r.status_code == 401 and r.json()["detail"]["error_type"] == "authentication_error"
        assert post(url, body, authorization="Bearer s3cret").status_code == 200


def test_overload_is_shed_before_the_body_is_read(demo_model):
    """item 11: over max_inflight, a 529 comes back while the body has not even been sent."""
    engines = make_engines(demo_model, max_inflight=1, slow_s=0.2)
    with live_server(engines, ApiSettings()) as url:
        busy = threading.Thread(
            target=post,
            args=(
                url,
                {"model": "jev-latest", "state": "x " * 50, "questions": {"q": {"type": "noul", "instructions": "?"}}},
            ),
        )
        busy.start()
        deadline = time.monotonic() + CASE_BUDGET_S
        while engines.inflight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        address = (urlparse(url).hostname, urlparse(url).port)
        head = (
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 99999\r\n\r\n"
        )
        with socket.create_connection(address, timeout=CASE_BUDGET_S) as s:
            s.sendall(head)
            reply = s.recv(65536)
        busy.join()
    assert reply.startswith(b"HTTP/1.1 529") and b"retry-after: 1" in reply.lower()
