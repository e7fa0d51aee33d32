"""The exact-answer cache over HTTP: a byte-equivalent request is answered from it (only timings differ), anything
that changes the answer misses, `Cache-Control: no-cache` bypasses it, API keys get scopes of their own unless the
operator shares them, and /metrics counts it all."""

from __future__ import annotations

import json
import re

import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.core.engine.answer_cache import AnswerCache
from basal.serve.server import answer_cache_series
from tests.servers import make_engines

STATE = "Paczka dotarła uszkodzona, klient chce zwrotu."
BODY = {"state": STATE, "questions": {"refund": {"type": "noul", "instructions": "Czy zwrot?"}}}
SYSTEMONE = {"model": "jev-latest", "state": STATE, "questions": {"refund": {"type": "noul", "instructions": "Zwrot?"}}}


def _client(engines, keys=(), shared=False, metrics=False):
    cache = AnswerCache(100, 1 << 20, 600)
    settings = ApiSettings(api_keys=tuple(keys), answer_cache=cache, caches_shared=shared, metrics=metrics)
    return TestClient(create_app(engines, settings)), cache


@pytest.fixture
def engines(demo_model):
    return make_engines(demo_model)


def _latency_out(content: bytes) -> bytes:
    return re.sub(rb'"latency_ms":[0-9.eE+-]+', b'"latency_ms":0', content)


@pytest.mark.parametrize("dialect,body", [("basal", BODY), ("systemone", SYSTEMONE)])
def test_a_repeat_is_a_hit_and_only_timings_differ(engines, dialect, body):
    client, cache = _client(engines)
    with client:
        raw = json.dumps(body).encode()
        first = client.post(f"/v1/{dialect}", content=raw, headers={"content-type": "application/json"})
        again = client.post(f"/v1/{dialect}", content=raw, headers={"content-type": "application/json"})
    assert first.status_code == again.status_code == 200
    assert (first.headers["x-basal-cache"], again.headers["x-basal-cache"]) == ("miss", "hit")
    assert _latency_out(again.content) == _latency_out(first.content)
    assert dialect == "systemone" or again.json()["usage"]["latency_ms"] < 5  # its own time, not the miss's
    assert again.headers["x-basal-compute-ms"] == "0.000"
    assert cache.counts.hits == 1 and cache.counts.misses == 1


def test_a_changed_option_or_body_byte_misses(engines):
    client, _ = _client(engines)
    with client:
        client.post("/v1/basal", json=BODY)
        with_diag = client.post("/v1/basal", json=BODY, headers={"x-basal-diagnostics": "1"})
        json_headers = {"content-type": "application/json"}
        spaced = client.post("/v1/basal", content=json.dumps(BODY, indent=1), headers=json_headers)
        diag_again = client.post("/v1/basal", json=BODY, headers={"x-basal-diagnostics": "1"})
    assert with_diag.headers["x-basal-cache"] == "miss" and "diagnostics" in with_diag.json()
    assert spaced.headers["x-basal-cache"] == "miss"
    assert diag_again.headers["x-basal-cache"] == "hit"
    assert _latency_out(diag_again.content) == _latency_out(with_diag.content)  # diagnostics spliced back


def test_no_cache_bypasses_and_no_store_keeps_nothing(engines):
    client, cache = _client(engines)
    with client:
        bypass = client.post("/v1/basal", json=BODY, headers={"cache-control": "no-cache"})
        after = client.post("/v1/basal", json=BODY)  # the bypassed answer was stored: a hit
        other = {**BODY, "state": STATE + " Jeszcze raz."}
        client.post("/v1/basal", json=other, headers={"cache-control": "no-store"})
        not_kept = client.post("/v1/basal", json=other)
    assert bypass.headers["x-basal-cache"] == "bypass" and float(bypass.headers["x-basal-compute-ms"]) > 0
    assert after.headers["x-basal-cache"] == "hit"
    assert not_kept.headers["x-basal-cache"] == "miss"
    assert cache.counts.bypasses == 1


@pytest.mark.parametrize("shared", [False, True])
def test_api_keys_get_scopes_of_their_own_unless_shared(engines, shared):
    client, _ = _client(engines, keys=("key-a", "key-b"), shared=shared)
    with client:
        a = client.post("/v1/basal", json=BODY, headers={"authorization": "Bearer key-a"})
        b = client.post("/v1/basal", json=BODY, headers={"authorization": "Bearer key-b"})
        a2 = client.post("/v1/basal", json=BODY, headers={"authorization": "Bearer key-a"})
    assert a.headers["x-basal-cache"] == "miss"
    assert b.headers["x-basal-cache"] == ("hit" if shared else "miss")
    assert a2.headers["x-basal-cache"] == "hit"


def test_errors_are_not_kept_and_metrics_count(engines):
    client, cache = _client(engines, metrics=True)
    engines.metrics.add_collector(answer_cache_series(cache))
    with client:
        bad = {"state": STATE, "questions": {"q": {"type": "nope"}}}
        for _ in range(2):
            assert client.post("/v1/basal", json=bad).headers.get("x-basal-cache") is None
        client.post("/v1/basal", json=BODY)
        client.post("/v1/basal", json=BODY)
        text = client.get("/metrics").text
    assert len(cache) == 1
    assert "basal_answer_cache_hits_total 1.0" in text and "basal_answer_cache_misses_total 1.0" in text
    assert f"basal_answer_cache_bytes {float(cache.bytes)}" in text and "basal_answer_cache_entries 1.0" in text


def test_the_plan_carries_the_key_scope_to_the_state_cache(engines, monkeypatch):
    seen = []
    engine = engines.engines[engines.default]
    plain = engine.admit
    monkeypatch.setattr(
        engine, "admit", lambda request, *a, **k: seen.append(request.cache_scope) or plain(request, *a, **k)
    )
    client, _ = _client(engines, keys=("key-a", "key-b"))
    with client:
        for key in ("key-a", "key-b", "key-a"):
            headers = {"authorization": f"Bearer {key}", "cache-control": "no-cache"}  # past the answer cache
            client.post("/v1/basal", json={**BODY, "state": STATE + key}, headers=headers)
    assert seen[0] == seen[2] != seen[1] and all(len(s) == 64 for s in seen)
