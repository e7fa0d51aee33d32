"""Shutdown with a long request in flight: the listener stays open while draining (/health says so, new requests
get the dialect's 503), and the request still running at the end of the grace period gets a JSON 503 with
Retry-After while its pass stops — nothing is computed for a client that will not get it."""

from __future__ import annotations

import threading
import time

import httpx

from basal.api.settings import ApiSettings
from tests.servers import make_engines, running_server

BODY = {"model": "jev-latest", "state": "x " * 200, "questions": {"q": {"type": "noul", "instructions": "?"}}}


def test_shutdown_drains_then_abandons_with_json_503(demo_model):
    engines = make_engines(demo_model, slow_s=3.0, yields_per_layer=30)  # a pass of 6 s, 0.1 s per checkpoint
    engine = engines.engines["basal-synthetic-demo"]
    with running_server(engines, ApiSettings(), grace_s=1.0) as (url, server):
        replies = []
        client = threading.Thread(
            target=lambda: replies.append(httpx.post(f"{url}/v1/systemone", json=BODY, timeout=30)), daemon=True
        )
        client.start()
        deadline = time.monotonic() + 10
        while engine.pipeline.backend.yields == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.should_exit = True  # what SIGTERM does
        time.sleep(0.3)
        health = httpx.get(f"{url}/health", timeout=5)  # the listener is still open while draining
        assert health.status_code == 503 and health.json()["status"] == "draining"
        late = httpx.post(f"{url}/v1/basal", json={"state": "x", "questions": {}}, timeout=5)
        assert late.status_code == 503 and late.json()["error"] and late.headers["retry-after"] == "1"
        client.join(15)
    reply = replies[0]
    assert reply.status_code == 503 and reply.headers["content-type"] == "application/json"
    assert reply.headers["retry-after"] == "1" and "shut" in reply.json()["detail"]
    assert engine.stopped_batches == 1 and engine.computed_jobs == 0
