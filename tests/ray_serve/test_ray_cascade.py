"""A cascade behind the Ray front: its steps on other replicas (here: each model's own in-process engines behind
its own deployment handle), answered as one process answers it, byte for byte."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from litestar.testing import TestClient

from basal.api.app import create_app
from basal.core.engine.cascade import Cascade, CascadeFront, Rule, Step
from basal.ray_serve.ingress import RayEngines
from tests.cascade_models import QUESTIONS, STATE, two_engines
from tests.ray_serve.test_ray_front import InProcessReplica


def test_a_cascade_over_ray_answers_as_in_one_process(tmp_path):
    local = two_engines(tmp_path)
    cascade = Cascade("casc", (Step("small", Rule("confidence", None, {"noul": 1.0})), Step("large", None)))
    handles = {name: InProcessReplica(local) for name in local.names}
    ray = RayEngines(handles, {name: local.model_info(name) for name in local.names}, "small")
    body = {"model": "casc", "state": STATE, "questions": QUESTIONS}
    try:
        with TestClient(create_app(CascadeFront(ray, [cascade]))) as over_ray:
            remote = over_ray.post("/v1/basal", json=body)
            listed = [m["name"] for m in over_ray.get("/v1/models").json()["models"]]
        with TestClient(create_app(CascadeFront(local, [cascade]))) as one:
            alone = one.post("/v1/basal", json=body)
    finally:
        local.close()
    assert remote.status_code == alone.status_code == 200, remote.text
    assert remote.headers["x-basal-answered-by"] == alone.headers["x-basal-answered-by"] == "small=3, large=2"
    strip = lambda r: {k: v for k, v in r.json().items() if k != "usage"}  # noqa: E731 - latency differs
    assert strip(remote) == strip(alone)
    assert listed == ["small", "large", "casc"]
