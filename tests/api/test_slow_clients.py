"""Connections as a hostile client holds them: oversized heads, silent and slow clients, too many connections,
garbage. Each case is answered (JSON) or closed within its short configured timeout, and /health still answers."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from basal.api.settings import ApiSettings
from basal.core.request.limits import Limits
from tests.servers import live_server, make_engines

LIMITS = Limits(
    max_header_count=32, max_header_bytes=8192, header_timeout_s=0.5, body_timeout_s=0.5, max_connections=16
)
CASE_BUDGET_S = 5.0  # every case ends well within this (its own timeouts are 0.5 s)


@pytest.fixture(scope="module")
def guarded(demo_model):
    with live_server(make_engines(demo_model), ApiSettings(limits=LIMITS)) as url:
        parsed = urlparse(url)
        yield url, (parsed.hostname, parsed.port)


def exchange(
    address, data: bytes = b"", pause_s: float = 0.0, chunks: list[bytes] | None = None
) -> tuple[bytes, float]:
    """Send `data` (or `chunks` with pauses), then read until the server closes; (reply, seconds until closed)."""
    started = time.monotonic()
    with socket.create_connection(address, timeout=CASE_BUDGET_S) as s:
        try:
            if data:
                s.sendall(data)
            for chunk in chunks or []:
                s.sendall(chunk)
                time.sleep(pause_s)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = b""
        try:
            while part := s.recv(65536):
                reply += part
        except ConnectionResetError:
            pass
    return reply, time.monotonic() - started


def status_and_json(reply: bytes) -> tuple[int, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


def health_ok(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=CASE_BUDGET_S).status_code == 200


def test_too_many_headers_is_431_before_parsing(guarded):
    url, address = guarded
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(40)) + b"\r\n"
    status, body = status_and_json(exchange(address, head)[0])
    assert status == 431 and "32 headers" in body["detail"]
    assert health_ok(url)


def test_oversized_header_is_431_without_waiting_for_its_end(guarded):
    url, address = guarded
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000  # never terminated
    reply, _ = exchange(address, head)
    assert status_and_json(reply)[0] == 431
    assert health_ok(url)


def test_headers_and_body_in_one_packet_are_fine(guarded):
    """Body bytes that arrive with the head are not counted as head bytes."""
    _url, address = guarded
    body = json.dumps({"state": "x" * 20000, "questions": {}}).encode()
    head = b"POST /v1/basal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    reply, _ = exchange(address, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert status_and_json(reply)[0] == 200


def test_silent_connection_is_closed_with_408(guarded):
    _url, address = guarded
    reply, seconds = exchange(address)
    status, body = status_and_json(reply)
    assert status == 408 and "headers" in body["detail"] and seconds < CASE_BUDGET_S


def test_slowloris_head_is_closed_at_its_deadline(guarded):
    """A head trickling in a byte at a time is cut at header_timeout_s in all, not per byte."""
    _url, address = guarded
    chunks = [b"GET /health HTTP/1.1\r\n"] + [b"X-a: b\r\n"] * 20
    reply, seconds = exchange(address, chunks=chunks, pause_s=0.1)
    assert status_and_json(reply)[0] == 408 and seconds < CASE_BUDGET_S


def test_slow_body_is_closed_at_its_deadline(guarded):
    url, address = guarded
    head = b"POST /v1/basal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    reply, seconds = exchange(address, head, chunks=[b"{"] * 20, pause_s=0.1)
    status, body = status_and_json(reply)
    assert status == 408 and "body" in body["detail"] and seconds < CASE_BUDGET_S
    assert health_ok(url)


def test_connections_over_the_limit_get_503_and_health_recovers(guarded):
    url, address = guarded
    held = [socket.create_connection(address) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.05)
        reply, seconds = exchange(address, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _ = status_and_json(reply)
        assert status == 503 and b"retry-after: 1" in reply.lower() and seconds < 1.0
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + CASE_BUDGET_S
    while time.monotonic() < deadline and not health_ok(url):
        time.sleep(0.05)
    assert health_ok(url)


def test_garbage_is_400_json(guarded):
    _url, address = guarded
    status, body = status_and_json(exchange(address, b"\x16\x03\x01 not http\r\n\r\n")[0])
    assert status == 400 and body["detail"]


def test_head_requests_are_200(guarded):
    url, _ = guarded
    for path in ("/health", "/v1/models"):
        r = httpx.head(f"{url}{path}", timeout=CASE_BUDGET_S)
        assert r.status_code == 200 and r.content == b""
