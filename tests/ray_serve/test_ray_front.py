"""The Ray front without a cluster: what it decides from its replicas' model facts alone."""

from __future__ import annotations

import asyncio
import copy

import pytest

pytest.importorskip("ray")

from litestar.testing import TestClient

from basal.api.app import create_app
from basal.ray_serve.ingress import RayEngines
from basal.ray_serve.replica import BasalReplica
from tests.conftest import golden_records
from tests.servers import make_engines

EVIDENCE = next(c["request"] for c in golden_records("systemone_cases_1.5.jsonl") if c["id"] == "m15-evidence-noul")


class Untouchable:
    """A deployment handle that fails the test if the front calls a replica."""

    def __getattr__(self, name):
        raise AssertionError(f"the front called the replica ({name}) for a request it must refuse itself")


@pytest.mark.parametrize("dialect", ["basal", "systemone"])
def test_evidence_for_a_model_without_a_head_is_refused_at_the_front_as_in_one_process(headless_model, dialect):
    local = make_engines(headless_model)
    name = headless_model.name
    info = local.model_info(name)
    assert not info.serves_evidence
    front = RayEngines({name: Untouchable()}, {name: info}, name)
    request = {**copy.deepcopy(EVIDENCE), "model": name}
    with TestClient(create_app(local)) as one, TestClient(create_app(front)) as ray_front:
        alone = one.post(f"/v1/{dialect}", json=request)
        refused = ray_front.post(f"/v1/{dialect}", json=request)
        models = ray_front.get("/v1/models")
    assert refused.status_code == alone.status_code == 422
    assert refused.json() == alone.json()
    assert models.status_code == 200 and models.json()["models"][0]["evidence"] is False


class InProcessReplica:
    """A deployment handle whose `answer.remote` runs `BasalReplica.answer` on in-process engines (no cluster)."""

    def __init__(self, engines):
        self.replica = object.__new__(BasalReplica)  # its __init__ needs a Ray replica context
        self.replica.engines, self.replica.name = engines, "in-process"
        self.answer = self

    def remote(self, request, affinity=None, background=False):
        return asyncio.ensure_future(self.replica.answer(request, affinity, background))


def test_diagnostics_cross_the_ray_front_as_in_one_process(demo_model):
    """The flag travels in the planned request and the diagnostics back in the replica's answer."""
    local = make_engines(demo_model)
    name = demo_model.name
    front = RayEngines({name: InProcessReplica(local)}, {name: local.model_info(name)}, name)
    request = {
        "model": name,
        "state": "Paczka dotarła uszkodzona",
        "questions": {"q": {"type": "noul", "instructions": "Czy zwrot?"}},
    }
    headers = {"x-basal-diagnostics": "1"}
    with TestClient(create_app(local)) as one, TestClient(create_app(front)) as ray_front:
        alone = one.post("/v1/systemone", json=request, headers=headers)
        over_ray = ray_front.post("/v1/systemone", json=request, headers=headers)
        plain = ray_front.post("/v1/systemone", json=request)
    assert over_ray.status_code == alone.status_code == 200, (over_ray.text, alone.text)
    assert over_ray.content == alone.content and "diagnostics" in over_ray.json()
    assert "diagnostics" not in plain.json()
