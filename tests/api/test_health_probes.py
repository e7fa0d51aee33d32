"""The probes: the listener opens before the models load, `/health/live` is 200 from the first moment to the last,
`/health/ready` (and `/health`, which means the same) is 503 with the reason whenever a decision request would be
refused — loading (with each model's step), every in-flight place taken, draining — and 200 otherwise."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
import pytest

import basal.serve.server
from basal.api.settings import ApiSettings
from basal.core.errors import ModelDirError
from basal.serve.config import parse_config
from tests.ports import free_port
from tests.servers import make_engines, running_server

BODY = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def wait_for(check, what: str, within_s: float = 60.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"never saw {what}")


def test_the_listener_opens_before_the_models_load(monkeypatch):
    release, servers = threading.Event(), []
    real_load = basal.serve.server.load_backend
    real_server = basal.serve.server._server

    def slow_load(*args, **kwargs):
        assert release.wait(60), "the test never released the load"
        return real_load(*args, **kwargs)

    def keep(*args, **kwargs):
        servers.append(real_server(*args, **kwargs))
        return servers[-1]

    monkeypatch.setattr(basal.serve.server, "load_backend", slow_load)
    monkeypatch.setattr(basal.serve.server, "_server", keep)
    url = f"http://127.0.0.1:{free_port()}"
    config = parse_config({"addr": url.removeprefix("http://"), "models": [{"path": "demo", "name": "m"}]})
    serving = threading.Thread(target=basal.serve.server.serve, args=(config,), daemon=True)
    serving.start()
    try:
        live = wait_for(lambda: httpx.get(f"{url}/health/live"), "the listener open during the load")
        assert live.status_code == 200 and live.json() == {"status": "alive"}
        ready = httpx.get(f"{url}/health/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        assert ready.json() == {
            "status": "loading",
            "models": {"m": "loading weights"},
            "inflight": 0,
            "max_inflight": 1024,
            "startup": {},
        }
        health = httpx.get(f"{url}/health")  # the original probe means ready, with its own body
        assert health.status_code == 503 and health.json() == {
            "status": "loading",
            "models": ["m"],
            "default_model": "m",
        }
        early = httpx.post(f"{url}/v1/systemone", json=BODY)
        assert early.status_code == 503 and "still loading" in early.json()["detail"]
        assert early.headers["retry-after"] == "1"
        late = httpx.post(f"{url}/v1/basal", json={"state": "x", "questions": {}})
        assert late.status_code == 503 and "still loading" in late.json()["error"]
        assert httpx.get(f"{url}/v1/models").status_code == 503
        release.set()
        wait_for(lambda: httpx.get(f"{url}/health/ready").status_code == 200, "ready after the load")
        loaded = httpx.get(f"{url}/health/ready").json()
        assert loaded["models"] == {"m": "loaded"}
        steps = loaded["startup"]["m"]  # how long each start-up step took; the held load shows in its step
        assert list(steps) == ["backend import", "weights, kernels and probes", "template prefix"]
        assert all(isinstance(s, float) and s >= 0 for s in steps.values())
        assert httpx.get(f"{url}/health").json() == {"status": "ok", "models": ["m"], "default_model": "m"}
        assert httpx.post(f"{url}/v1/systemone", json=BODY).status_code == 200
        assert httpx.get(f"{url}/v1/models").json()["models"][0]["name"] == "m"
    finally:
        release.set()
        wait_for(lambda: servers, "the server")[0].should_exit = True
        serving.join(30)
    assert not serving.is_alive()


def test_a_load_that_fails_stops_the_listener_and_is_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise ModelDirError("model.safetensors: truncated")

    monkeypatch.setattr(basal.serve.server, "load_backend", broken)
    config = parse_config({"addr": f"127.0.0.1:{free_port()}"})
    with pytest.raises(ModelDirError, match="truncated"):
        basal.serve.server.serve(config)


def test_ready_is_503_while_every_place_is_taken_and_while_draining(demo_model):
    engines = make_engines(demo_model, max_inflight=1, slow_s=1.0, yields_per_layer=10)
    engine = engines.engines["basal-synthetic-demo"]
    with running_server(engines, ApiSettings(), grace_s=10.0) as (url, server):
        assert httpx.get(f"{url}/health/ready").status_code == 200
        replies = []
        client = threading.Thread(
            target=lambda: replies.append(httpx.post(f"{url}/v1/systemone", json=BODY, timeout=30))
        )
        client.start()
        wait_for(lambda: engine.pipeline.backend.yields, "the request computing")
        ready = httpx.get(f"{url}/health/ready")
        assert ready.status_code == 503
        assert ready.json() == {
            "status": "overloaded",
            "models": {"basal-synthetic-demo": "loaded"},
            "inflight": 1,
            "max_inflight": 1,
            "startup": {},  # engines built by the test, not loaded by `basal serve`
        }
        assert httpx.get(f"{url}/health").json()["status"] == "overloaded"
        assert httpx.post(f"{url}/v1/systemone", json=BODY).status_code == 529  # what ready's 503 foretold
        assert httpx.get(f"{url}/health/live").status_code == 200
        server.should_exit = True  # what SIGTERM does: the drain waits for the request in flight
        wait_for(lambda: httpx.get(f"{url}/health/ready").json()["status"] == "draining", "draining")
        assert httpx.get(f"{url}/health/live").status_code == 200  # a draining process is alive: no restart
        client.join(30)
    assert replies[0].status_code == 200


def test_ray_readiness_asks_for_a_running_replica_not_a_healthy_application(monkeypatch):
    """One of two replicas dead: the application is UNHEALTHY (then DEPLOYING) while the other answers."""
    serve = pytest.importorskip("ray.serve")
    from basal.ray_serve.app import _ready_check

    def status(app_status: str, **replica_states: int):
        deployment = SimpleNamespace(replica_states=replica_states)
        app = SimpleNamespace(status=app_status, deployments={"BasalReplica": deployment})
        return SimpleNamespace(applications={"basal-m": app})

    for app_status, replicas, expected in (
        ("RUNNING", {"RUNNING": 2}, True),
        ("UNHEALTHY", {"RUNNING": 1, "UNHEALTHY": 1}, True),
        ("DEPLOYING", {"RUNNING": 1, "STARTING": 1}, True),
        ("DEPLOYING", {"STARTING": 2}, False),
        ("UNHEALTHY", {"UNHEALTHY": 2}, False),
    ):
        monkeypatch.setattr(serve, "status", lambda s=app_status, r=replicas: status(s, **r))
        assert _ready_check(["m"], every_s=0.0)() is expected, (app_status, replicas)
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={}))
    assert _ready_check(["m"], every_s=0.0)() is False
