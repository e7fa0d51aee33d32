"""Slow request bodies hold no decision capacity: bodies are read before a request takes one of `max_inflight`
places, and the bytes of bodies in transit have their own budget (`limits.max_transit_bytes`)."""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from urllib.parse import urlparse

import httpx
import pytest

from basal.api.settings import ApiSettings
from basal.core.request.limits import Limits
from tests.servers import live_server, make_engines

MAX_INFLIGHT = 4
LIMITS = Limits(body_timeout_s=30.0, max_transit_bytes=4096)
REQUEST = {"model": "jev-latest", "state": "It rains.", "questions": {"q": {"type": "noul", "instructions": "Wet?"}}}
WAIT_S = 20.0  # for the server to have read what the slow clients sent (a loop turn; generous on a busy machine)


@pytest.fixture(scope="module")
def server(demo_model):
    engines = make_engines(demo_model, max_inflight=MAX_INFLIGHT)
    settings = ApiSettings(limits=LIMITS)
    with live_server(engines, settings) as url:
        parsed = urlparse(url)
        yield url, (parsed.hostname, parsed.port), engines, settings


def slow_body(stack: ExitStack, address, declared: int, sent: bytes) -> socket.socket:
    """A connection that sends its head and the first bytes of a body of `declared` bytes, then nothing more."""
    s = stack.enter_context(socket.create_connection(address, timeout=WAIT_S))
    head = "POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    head += f"content-length: {declared}\r\n\r\n"
    s.sendall(head.encode() + sent)
    return s


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the server never read what was sent"
        time.sleep(0.02)


def test_slow_bodies_do_not_hold_decision_slots(server):
    url, address, engines, settings = server
    with ExitStack() as stack:
        for _ in range(2 * MAX_INFLIGHT):
            slow_body(stack, address, 200, b"{")
        # the server has read every slow client's first byte: as bytes in transit, or (before) as held slots
        wait_until(
            lambda: (
                (getattr(settings, "transit", None) and settings.transit.bytes == 2 * MAX_INFLIGHT)
                or engines.inflight == MAX_INFLIGHT
            )
        )
        r = httpx.post(f"{url}/v1/systemone", json=REQUEST, timeout=WAIT_S)
        assert r.status_code == 200, r.text
        assert engines.inflight == 0
    wait_until(lambda: settings.transit.bytes == 0)  # closed connections give their bytes back


def test_bytes_in_transit_are_bounded(server):
    url, address, _, settings = server
    with ExitStack() as stack:
        slow_body(stack, address, 4000, b" " * 3000)
        wait_until(lambda: settings.transit.bytes == 3000)
        body = b'{"model": "jev-latest", "state": "%s", "questions": {}}' % (b"x" * 2000)
        r = httpx.post(f"{url}/v1/systemone", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 529 and r.headers["retry-after"] == "1"
        assert httpx.post(f"{url}/v1/systemone", json=REQUEST).status_code == 200  # small bodies still fit
    wait_until(lambda: settings.transit.bytes == 0)
    assert (
        httpx.post(f"{url}/v1/systemone", content=body, headers={"content-type": "application/json"}).status_code == 422
    )
