"""Diagnostics on request (`x-basal-diagnostics: 1`): absent, the response of either dialect is byte for byte what
it was; present, the same bytes with one more member, whose per-order distributions recompute every answer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from basal.core.model.synth import TEMPERATURES
from tests.api.test_http import post

QUESTIONS = {
    "kind": {"type": "choice", "instructions": "Rodzaj?", "criteria": {"damage": "Uszkodzenie", "late": "Opóźnienie"}},
    "refund": {"type": "noul", "instructions": "Czy zwrot?"},
    "urgency": {"type": "score", "instructions": "Jak pilne?", "criteria": ["niska", "średnia", "wysoka"]},
    "tags": {"type": "multi", "instructions": "Tematy?", "criteria": ["płatność", "dostawa"]},
    "route": {
        "type": "act",
        "instructions": "Zwrot?",
        "costs": {"pay": {"true": 0, "false": 1}, "deny": {"true": 1, "false": 0}},
    },
    "city": {"type": "choice", "instructions": "Miasto?", "criteria": {f"c{i}": f"miasto {i}" for i in range(12)}},
    "only": {"type": "choice", "instructions": "Jedyna?", "criteria": {"tak": "Tak"}},
}
STATE = "Paczka za 129,99 zł dotarła 3 dni po terminie, uszkodzona."


def _request(dialect: str, model: str) -> dict:
    """Every question type the dialect answers (1 and 11..255-option choices: TypeSafe only)."""
    if dialect == "basal":
        basal = {k: v for k, v in QUESTIONS.items() if k not in ("city", "only")}
        return {"model": model, "state": STATE, "questions": basal}
    return {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}


def _without_latency(body: bytes) -> bytes:
    """/v1/basal reports the request's wall time in usage.latency_ms: the one number that differs between runs."""
    return re.sub(rb'"latency_ms":[0-9.e+-]+', b'"latency_ms":0', body)


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_default_bytes_unchanged_and_diagnostics_appended(client, demo_model, dialect):
    request = _request(dialect, demo_model.name)
    plain = post(client, request, f"/v1/{dialect}")
    off = post(client, request, f"/v1/{dialect}", **{"x-basal-diagnostics": "0"})
    on = post(client, request, f"/v1/{dialect}", **{"x-basal-diagnostics": "true"})
    assert plain.status_code == off.status_code == on.status_code == 200, on.text
    assert b"diagnostics" not in plain.content
    assert _without_latency(off.content) == _without_latency(plain.content)
    head, marker, _ = on.content.partition(b',"diagnostics":')
    assert marker and _without_latency(head + b"}") == _without_latency(plain.content)
    if dialect == "systemone":  # no timing inside the body: exactly the same bytes
        assert off.content == plain.content and head + b"}" == plain.content
    body = on.json()
    assert list(body) == [*plain.json(), "diagnostics"]
    diagnostics = body["diagnostics"]
    assert diagnostics["prompt_tokens"] == body["usage"]["input_tokens"]
    assert 0 < diagnostics["packed_tokens"] < diagnostics["prompt_tokens"]  # shared prefixes counted once
    assert list(diagnostics["questions"]) == list(request["questions"])


def _recompute(readout: dict, temperature: float) -> tuple[dict[str, float], dict[str, float]]:
    """The contract's math, from the per-order numbers alone: mean of the orders, then the temperature."""
    keys = list(readout["average"])
    orders = [np.array([o["probabilities"][k] for k in keys]) for o in readout["orders"]]
    average = sum(orders) / len(orders)
    p = np.log(np.maximum(average, 1e-12)) / temperature
    calibrated = np.exp(p - p.max()) / np.exp(p - p.max()).sum()
    return dict(zip(keys, average.tolist(), strict=True)), dict(zip(keys, calibrated.tolist(), strict=True))


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_per_order_distributions_recompute_the_answer(client, demo_model, dialect):
    body = post(client, _request(dialect, demo_model.name), f"/v1/{dialect}", **{"x-basal-diagnostics": "1"}).json()
    answers, questions = body["answers"], body["diagnostics"]["questions"]
    for name in ("kind", "refund", "urgency", "tags", "route"):
        d = questions[name]
        assert d["temperature"] == TEMPERATURES[d["type"]] and d["rounds"] == 1
        for readout in d["readouts"]:
            assert len(readout["orders"]) == 2
            assert all(0 < o["letter_mass"] <= 1 for o in readout["orders"])  # the torch backend computes it
            assert [o["letters"] for o in readout["orders"]] == [
                list(readout["average"]),
                list(readout["average"])[::-1],
            ]
            average, calibrated = _recompute(readout, d["temperature"])
            assert average == pytest.approx(readout["average"], rel=1e-12)
            assert calibrated == pytest.approx(readout["calibrated"], rel=1e-12)
    assert questions["kind"]["readouts"][0]["calibrated"] == answers["kind"]["probabilities"]
    assert questions["urgency"]["readouts"][0]["calibrated"] == answers["urgency"]["probabilities"]
    assert questions["route"]["readouts"][0]["calibrated"] == answers["route"]["probabilities"]
    refund = questions["refund"]["readouts"][0]["calibrated"]["true"]
    assert refund == (
        answers["refund"]["noul"] if dialect == "systemone" else answers["refund"]["probabilities"]["true"]
    )
    tags = {r["name"].rpartition("#")[2] or r["name"]: r["calibrated"]["true"] for r in questions["tags"]["readouts"]}
    assert sorted(tags.values()) == sorted(answers["tags"]["probabilities"].values())
    if dialect == "systemone":
        city = questions["city"]  # 12 options: the joint of two rounds, calibrated
        assert city["rounds"] == 2 and city["readouts"][0]["orders"] == []
        assert city["readouts"][0]["calibrated"] == answers["city"]["probabilities"]
        assert questions["only"]["readouts"][0] == {
            "name": "only",
            "orders": [],
            "average": {"tak": 1.0},
            "calibrated": {"tak": 1.0},
        }


def test_facts_block_is_shown(client, demo_model):
    state = "Dziś jest 15 kwietnia 2026 r. Towar wydano 21 marca 2026 r."
    request = {**_request("basal", demo_model.name), "facts": "auto", "state": state}
    body = post(client, request, "/v1/basal", **{"x-basal-diagnostics": "1"}).json()
    facts = body["diagnostics"]["questions"]["refund"]["facts"]
    assert facts.strip() and state not in facts and "25" in facts  # 21 March to 15 April: 25 days
    plain = post(client, _request("basal", demo_model.name), "/v1/basal", **{"x-basal-diagnostics": "1"}).json()
    assert plain["diagnostics"]["questions"]["refund"]["facts"] is None


@pytest.mark.parametrize(("dialect", "status"), [("systemone", 400), ("basal", 422)])
def test_a_bad_header_value_is_refused(client, demo_model, dialect, status):
    r = post(client, _request(dialect, demo_model.name), f"/v1/{dialect}", **{"x-basal-diagnostics": "yes please"})
    assert r.status_code == status
    assert "x-basal-diagnostics must be 1, true, 0 or false" in json.dumps(r.json())


def test_the_header_is_in_the_openapi_document(client):
    paths = client.get("/schema/openapi.json").json()["paths"]
    for dialect in ("systemone", "basal"):
        (parameter,) = paths[f"/v1/{dialect}"]["post"]["parameters"]
        assert parameter["name"] == "x-basal-diagnostics" and parameter["in"] == "header"
        assert parameter["schema"]["enum"] == ["0", "1", "true", "false"]
