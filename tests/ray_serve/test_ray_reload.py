"""A changed calibration behind Ray Serve (a local Ray, 2 CPU replicas of a synthetic demo model): SIGHUP to the
front makes every replica read its file again in place; the front then announces it in /v1/models and empties its
answer cache; a malformed file leaves every replica serving the old one."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray")

from basal.api.settings import ApiSettings
from basal.core.engine.answer_cache import AnswerCache
from basal.core.model.synth import synth_model
from basal.ray_serve.app import follow_reloads, start
from basal.ray_serve.reload import generation, hub
from basal.serve.config import parse_config
from tests.servers import live_server

pytestmark = pytest.mark.slow  # a Ray cluster of its own: about 20 s

QUESTIONS = {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"a": "Pay", "b": "Bugs"}}}


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    from ray import serve

    root = tmp_path_factory.mktemp("ray-reload")
    model = synth_model(root / "model", "demo", seed=0)
    mine = root / "mine.json"
    shipped = json.loads((model / "CALIBRATION.json").read_text())
    mine.write_text(json.dumps(shipped))
    config = parse_config({"models": [{"path": str(model), "calibration": str(mine)}], "ray": {"replicas": 2}})
    engines = start(config)
    cache = AnswerCache(64, 1 << 20, 600.0)
    before = signal.getsignal(signal.SIGHUP)
    stop = follow_reloads(engines, cache.clear)
    try:
        with live_server(engines, ApiSettings(answer_cache=cache)) as url:
            yield url, mine, shipped
    finally:
        stop.set()
        signal.signal(signal.SIGHUP, before)
        serve.shutdown()


def _served(url: str) -> dict:
    return httpx.get(url + "/v1/models", timeout=30).json()["models"][0]["calibration"]


def _post(url: str, state: str) -> httpx.Response:
    body = {"model": "jev-latest", "state": state, "questions": QUESTIONS}
    r = httpx.post(url + "/v1/systemone", json=body, headers={"x-basal-diagnostics": "1"}, timeout=120)
    assert r.status_code == 200, r.text
    return r


def _temperatures_by_replica(url: str, tag: str) -> dict[str, set[float]]:
    """The choice temperature each replica applied, over requests spread by their states (affinity); `tag` makes
    them new requests (none answered from the cache)."""
    seen: dict[str, set[float]] = {}
    for i in range(24):
        r = _post(url, f"Ticket {tag}{i}: " + "the parcel arrived damaged and the customer wants a refund. " * 6)
        seen.setdefault(r.headers["x-basal-replica"], set()).add(
            r.json()["diagnostics"]["questions"]["team"]["temperature"]
        )
    return seen


def _wait(condition, what: str, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_sighup_reloads_every_replica_and_the_front(front) -> None:
    url, mine, shipped = front
    assert _served(url)["sha256"] == hashlib.sha256(mine.read_bytes()).hexdigest()
    state = "Customer 7 writes: my refund never came."
    _post(url, state)
    assert _post(url, state).headers["x-basal-cache"] == "hit"
    old = shipped["temperature_per_prim"]["choice"]
    assert {t for ts in _temperatures_by_replica(url, "a").values() for t in ts} == {old}

    mine.write_text(json.dumps(dict(shipped, temperature_per_prim=dict(shipped["temperature_per_prim"], choice=2.5))))
    os.kill(os.getpid(), signal.SIGHUP)
    new_sha = hashlib.sha256(mine.read_bytes()).hexdigest()
    _wait(lambda: _served(url)["sha256"] == new_sha, "/v1/models to announce the new file")

    assert _post(url, state).headers["x-basal-cache"] == "miss"  # the answer under the old calibration is gone
    by_replica = _temperatures_by_replica(url, "b")
    assert len(by_replica) == 2 and all(ts == {2.5} for ts in by_replica.values()), by_replica


def test_a_malformed_file_leaves_every_replica_on_the_served_one(front) -> None:
    import ray

    url, mine, _shipped = front
    served = _served(url)
    temperature = json.loads(Path(mine).read_text())["temperature_per_prim"]["choice"]
    mine.write_text("{not json")
    g = generation() + 1  # the handler bumps it (on a thread of its own)
    os.kill(os.getpid(), signal.SIGHUP)

    def both_reported() -> bool:
        reports = ray.get(hub().reported.remote(g))
        return len(reports) >= 2 and all(any(v.startswith("error") for v in o.values()) for _, o in reports.values())

    _wait(both_reported, "both replicas to report the reload")
    assert _served(url) == served
    assert {t for ts in _temperatures_by_replica(url, "c").values() for t in ts} == {temperature}
