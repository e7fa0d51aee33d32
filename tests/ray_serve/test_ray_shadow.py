"""Shadow traffic and drift behind the Ray front, composed as `basal serve-ray`'s front composes them (`listen`'s
`_server`): the shadow model's copies go to its own replicas (here: its in-process engines behind its own
deployment handle) on the background lane; the agreement equals an independent computation over one process's
answers, the primary's answers are those of one process without a shadow, and the drift series count them."""

from __future__ import annotations

import time
from collections import Counter

import pytest

pytest.importorskip("ray")

from litestar.testing import TestClient

from basal.core.engine.drift import DriftFront
from basal.ray_serve.ingress import RayEngines
from basal.ray_serve.replica_metrics import ReplicaCollector
from basal.serve.config import parse_config
from basal.serve.server import _server
from tests.cascade_models import QUESTIONS, two_engines
from tests.ray_serve.test_ray_front import InProcessReplica

STATES = [f"Ticket {i}: my payouts have failed {i} times and support does not answer." for i in range(6)]
ASKED = {k: v for k, v in QUESTIONS.items() if k != "topics"}  # choice, noul and score: one distribution each


class Recorded(InProcessReplica):
    """An in-process replica that records each call's (model, background)."""

    def __init__(self, engines, calls: list):
        super().__init__(engines)
        self.calls = calls

    def remote(self, request, affinity=None, background=False):
        self.calls.append((request.model, background))
        return super().remote(request, affinity, background)


def _decision(spec: dict, answer: dict) -> tuple[str, float]:
    """(decision label, probability of the chosen option) from an answer's JSON, without the shadow module."""
    if spec["type"] == "noul":
        return str(answer["noul"] >= 0.5), answer["noul"]
    p = answer["probabilities"]
    label = max(p, key=p.get)
    return label, p[label]


def test_a_shadow_behind_the_ray_front_reports_agreement(tmp_path, monkeypatch):
    monkeypatch.setattr(ReplicaCollector, "collect", lambda self: iter(()))  # no cluster to read replicas' series
    local = two_engines(tmp_path)
    calls: list = []
    handles = {name: Recorded(local, calls) for name in local.names}
    ray = RayEngines(handles, {name: local.model_info(name) for name in local.names}, "small")
    config = parse_config(
        {
            "metrics": True,
            "models": [
                {"path": str(tmp_path / "small"), "shadow": {"model": "large", "sample": 1.0}},
                {"path": str(tmp_path / "large")},
            ],
        }
    )
    server = _server(ray, config)
    assert isinstance(server.engines, DriftFront)
    try:
        with TestClient(server.config.app) as client:
            responses = []
            for state in STATES:
                r = client.post("/v1/systemone", json={"model": "small", "state": state, "questions": ASKED})
                assert r.status_code == 200, r.text
                responses.append(r.json()["answers"])
            for _ in range(400):  # the copies run after the answers: poll until all are compared
                summary = client.get("/v1/shadow").json()["shadows"][0]
                if summary["requests"]["compared"] == len(STATES):
                    break
                time.sleep(0.05)
            metrics = client.get("/metrics").text
        alone = {}
        with TestClient(_server(local, parse_config({})).config.app) as one:  # one process, no shadow
            for model in ("small", "large"):
                alone[model] = [
                    one.post("/v1/systemone", json={"model": model, "state": s, "questions": ASKED}).json()["answers"]
                    for s in STATES
                ]
    finally:
        local.close()

    assert responses == alone["small"]  # the primary's answers as one process gives them without a shadow
    assert sorted(set(calls)) == [("large", True), ("small", False)]  # the copies: the shadow's handle, background
    assert calls.count(("large", True)) == len(STATES)
    assert summary["model"] == "small" and summary["shadow"] == "large"
    assert summary["requests"] == {"sampled": 6, "compared": 6, "dropped": 0, "failed": 0}
    expected: dict[str, list[tuple[bool, float]]] = {}
    for p, s in zip(alone["small"], alone["large"], strict=True):
        for name, spec in ASKED.items():
            (pd, pp), (sd, _) = _decision(spec, p[name]), _decision(spec, s[name])
            sp = s[name]["noul"] if spec["type"] == "noul" else s[name]["probabilities"][pd]
            expected.setdefault(spec["type"], []).append((pd == sd, abs(pp - sp)))
    for kind, rows in expected.items():
        got = summary["types"][kind]
        assert got["compared"] == len(rows)
        assert got["agreement"] == sum(a for a, _ in rows) / len(rows)
        assert got["mean_abs_dp"] == pytest.approx(sum(d for _, d in rows) / len(rows), abs=1e-12)

    counted = Counter()  # the drift series, counted by the Ray front's process: every primary answer, no copy
    for family in ray.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "basal_drift_answers_total":
                counted[sample.labels["model"], sample.labels["question"]] += sample.value
    assert counted == {("small", name): len(STATES) for name in ASKED}
    assert "basal_drift_answers_total" in metrics
