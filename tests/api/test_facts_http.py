"""``facts`` over HTTP: the request_error vectors on their dialect, answers with the block, errors never a 500."""

from __future__ import annotations

import json

import pytest

from tests.core.facts.vectors import vectors

ERRORS = vectors("request_error")
PATHS = {"upstream": "/v1/basal", "typesafe": "/v1/systemone"}
MODEL = "basal-synthetic-demo"


def post(client, path, body):
    return client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("vector", ERRORS, ids=[v["id"] for v in ERRORS])
def test_request_error_vectors(client, vector):
    body = dict(vector["request"])
    if "model" in body:
        body["model"] = MODEL  # the vector names the model it was written for
    r = post(client, PATHS[vector["dialect"]], body)
    assert (r.status_code, r.json()) == (vector["expected"]["status"], vector["expected"]["body"])


def request(facts, state="Doręczono 20 marca 2027 r., termin 7 dni."):
    return {"model": MODEL, "state": state, "facts": facts, "questions": {"q": {"type": "noul", "instructions": "?"}}}


@pytest.mark.parametrize("path", PATHS.values())
def test_the_block_is_read_by_the_model(client, path):
    off, auto = post(client, path, request("off")), post(client, path, request("auto"))
    assert off.status_code == auto.status_code == 200
    assert auto.json()["usage"]["input_tokens"] > off.json()["usage"]["input_tokens"]  # both orders see the block


def test_computation_errors_are_422_in_each_dialect(client):
    body = request("auto", state="Data 31.12.9999 i 7 dni.")
    r = post(client, "/v1/basal", body)
    assert (r.status_code, r.json()) == (422, {"error": "date value out of range"})
    r = post(client, "/v1/systemone", body)
    assert (r.status_code, r.json()) == (
        422,
        {"detail": [{"type": "value_error", "loc": ["body", "state"], "msg": "date value out of range"}]},
    )


def test_null_differs_between_the_dialects(client):
    assert post(client, "/v1/systemone", request(None)).status_code == 200
    r = post(client, "/v1/basal", request(None))
    assert (r.status_code, r.json()) == (422, {"error": 'facts must be "off" or "auto"'})


def test_the_readme_facts_example(client):
    body = {
        "model": "jev-latest",
        "facts": "auto",
        "state": "Dziś jest 15 kwietnia 2026 r. Towar wydano 21 marca 2026 r., a klient odstąpił od umowy 3.04.2026.",
        "questions": {"ontime": {"type": "noul", "instructions": "Czy odstąpienie złożono w terminie 14 dni?"}},
    }
    r = post(client, "/v1/systemone", body)
    assert r.status_code == 200 and list(r.json()["answers"]["ontime"]) == ["type", "noul"]
