"""The exit status after SIGTERM: uvicorn raises the signal again once it has shut down, which ends the process with
143; basal keeps that only when the grace period ran out and requests were abandoned. A drain that finished every
request in flight is a clean stop: no signal raised again, `basal serve` returns and the process exits 0 (what
`docker stop` and Kubernetes expect). The server runs on this (the main) thread, where uvicorn takes signals; a
handler of the test's own stands in for the default one, so the signal raised again is recorded, not fatal."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from basal.api.app import create_app
from basal.api.http.listener import DrainingServer, server_config
from tests.ports import free_port
from tests.servers import make_engines

BODY = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}


@pytest.mark.parametrize(
    ("grace_s", "raised_again", "answered"),
    [(30.0, [], 200), (0.2, [signal.SIGTERM], 503)],
    ids=["drained: exit 0", "abandoned: exit 143"],
)
def test_sigterm_is_raised_again_only_when_the_drain_abandoned_requests(demo_model, grace_s, raised_again, answered):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("uvicorn takes signals on the main thread only")
    engines = make_engines(demo_model, slow_s=0.5, yields_per_layer=5)  # a request computes for a second or more
    backend = engines.engines["basal-synthetic-demo"].pipeline.backend
    port = free_port()
    config = server_config(create_app(engines), "127.0.0.1", port, log_level="warning")
    server = DrainingServer(config, engines, grace_s)
    replies: list[httpx.Response] = []
    post = threading.Thread(
        target=lambda: replies.append(httpx.post(f"http://127.0.0.1:{port}/v1/systemone", json=BODY, timeout=60))
    )

    def client() -> None:
        while not server.started:
            time.sleep(0.02)
        post.start()
        while not backend.yields:  # the request is computing
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        threading.Thread(target=client, daemon=True).start()
        server.run()
        post.join(60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == raised_again
    assert replies[0].status_code == answered
