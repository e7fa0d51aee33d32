"""An upload's body is timed by its gaps, not its total: with `body_timeout_s` at 1 s, an upload that keeps sending
for 3 s in all is stored, one that stalls for over 1 s gets the same 408 as a slow decision body, and a decision
body still has 1 s in all."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from basal.api.settings import ApiSettings
from basal.core.request.limits import Limits
from tests.api.test_batches import service
from tests.api.test_upload_stream import CONTENT_TYPE, HEAD, TAIL, _line
from tests.servers import live_server, make_engines

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(demo_model, tmp_path_factory):
    svc = service(tmp_path_factory.mktemp("slow-uploads"), None, max_upload_bytes=4_000_000)
    settings = ApiSettings(limits=Limits(body_timeout_s=TIMEOUT_S))
    with live_server(make_engines(demo_model), settings, batches=svc) as url:
        yield (urlparse(url).hostname, urlparse(url).port), svc


def send_slowly(address, head: bytes, chunks: list[bytes], pause_s: float) -> tuple[bytes, float]:
    """The head, then each chunk after a pause; -> (the reply once the server closes or answers, seconds taken)."""
    started = time.monotonic()
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(head)
        try:
            for chunk in chunks:
                time.sleep(pause_s)
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = b""
        try:
            while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
                part = s.recv(65536)
                if not part:
                    break
                reply += part
        except ConnectionResetError:
            pass
    return reply, time.monotonic() - started


def _length(reply: bytes) -> int:
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def upload_head(length: int) -> bytes:
    return (
        f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_slow_but_steady_upload_is_stored(server):
    address, svc = server
    lines = [_line(n, 100) for n in range(10)]
    body = HEAD + b"".join(lines) + TAIL
    reply, seconds = send_slowly(address, upload_head(len(body)), [HEAD, *lines, TAIL], pause_s=TIMEOUT_S / 4)
    assert seconds > 2.5 * TIMEOUT_S  # well past the body timeout in all
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    stored = json.loads(reply.partition(b"\r\n\r\n")[2])
    assert svc.store.get_file(stored["id"])["lines"] == 10


def test_an_upload_that_stalls_gets_408(server):
    """Four chunks a quarter of the timeout apart, then nothing: the 408 comes the timeout after the last one."""
    address, _ = server
    lines = [_line(n, 100) for n in range(6)]
    body = HEAD + b"".join(lines) + TAIL
    reply, seconds = send_slowly(address, upload_head(len(body)) + HEAD, lines[:4], pause_s=TIMEOUT_S / 4)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {"detail": "Request body not received in time."}
    assert 2 * TIMEOUT_S - 0.1 <= seconds < 3 * TIMEOUT_S


def test_a_decision_body_still_has_body_timeout_s_in_all(server):
    address, _ = server
    head = b"POST /v1/basal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    reply, seconds = send_slowly(address, head, [b"{"] * 12, pause_s=TIMEOUT_S / 4)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert seconds < 2 * TIMEOUT_S  # cut at the timeout in all, while it was still sending
    assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {"detail": "Request body not received in time."}


def test_time_the_server_is_not_reading_does_not_count(server, monkeypatch):
    """A 600 KB upload sent at once to a store whose first write takes 1.5 timeouts: uvicorn stops reading (its
    buffer is full) while the store writes, so no byte arrives for longer than the timeout, by the server's doing
    alone. The upload is stored."""
    from basal.api.routes.batches import StoredUpload

    address, svc = server
    write, first = StoredUpload.write, [True]

    def slow_write(self, data: bytes) -> None:
        if first:
            first.clear()
            time.sleep(1.5 * TIMEOUT_S)
        write(self, data)

    monkeypatch.setattr(StoredUpload, "write", slow_write)
    lines = [_line(n, 5000) for n in range(120)]
    body = HEAD + b"".join(lines) + TAIL
    reply, seconds = send_slowly(address, upload_head(len(body)) + body, [], pause_s=0)
    assert seconds > 1.5 * TIMEOUT_S
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert svc.store.get_file(json.loads(reply.partition(b"\r\n\r\n")[2])["id"])["lines"] == 120
