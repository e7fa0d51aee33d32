"""``GET /v1/models`` announces exactly what each endpoint accepts: every range's bounds are sent and answered, one
past each bound is refused; the native SDK's discovery fields are there."""

from __future__ import annotations

import pytest

from basal.core.errors import RequestError
from basal.core.request.dialects import parse_basal, parse_systemone
from tests.api.test_http import post

PARSERS = {"/v1/systemone": parse_systemone, "/v1/basal": parse_basal}
CHEAP = 10  # bounds up to this are also sent over HTTP (the larger ones run hundreds of prompts)


def question(kind: str, n: int) -> dict:
    if kind == "choice":
        return {"type": "choice", "instructions": "?", "criteria": {f"k{i}": f"option {i}" for i in range(n)}}
    if kind == "score":
        return {"type": "score", "instructions": "?", "criteria": [f"level {i}" for i in range(n)]}
    if kind == "act":
        criteria = {f"k{i}": f"option {i}" for i in range(n)}
        return {"type": "act", "instructions": "?", "criteria": criteria, "costs": {"wrong": 2, "defer": 1}}
    return {"type": "multi", "instructions": "?", "criteria": {f"k{i}": f"label {i}" for i in range(n)}}


def body(model: str, kind: str, n: int) -> dict:
    return {"model": model, "state": "The order arrived late.", "questions": {"q": question(kind, n)}}


def accepted(path: str, model: str, kind: str, n: int) -> bool:
    try:
        PARSERS[path](body(model, kind, n), lambda _name: model)
    except RequestError:
        return False
    return True


def test_every_announced_range_is_what_the_endpoint_enforces(client):
    (model,) = client.get("/v1/models").json()["models"]
    ranges = model["options"]
    assert set(ranges) == set(PARSERS)
    sent = 0
    for path, kinds in ranges.items():
        assert set(kinds) == {"choice", "score", "act", "multi_labels"}
        for field, span in kinds.items():
            kind = field.removesuffix("_labels")
            low, high = (int(x) for x in span.split(".."))
            for n, ok in ((low - 1, False), (low, True), (high, True), (high + 1, False)):
                if kind == "act" and n == 0:
                    continue  # an act without criteria is a yes/no readout (2 options), not 0 options
                assert accepted(path, model["name"], kind, n) == ok, (path, kind, n)
                if n <= CHEAP:
                    r = post(client, body(model["name"], kind, n), path)
                    assert (r.status_code == 200) == ok, (path, kind, n, r.status_code, r.text[:200])
                    sent += 1
    assert sent == 20  # every bound up to CHEAP and one past it, of both endpoints


def test_native_discovery_fields(client):
    (model,) = client.get("/v1/models").json()["models"]
    assert model["orders"] == 2
    assert model["temperature_per_prim"] and set(model["temperature_per_prim"]) <= {"choice", "noul", "score"}
    assert all(isinstance(t, float) for t in model["temperature_per_prim"].values())


@pytest.mark.parametrize("path", list(PARSERS))
def test_an_act_without_criteria_is_a_yes_no_readout(client, path):
    q = {"type": "act", "instructions": "?", "costs": {"wrong": 2, "defer": 1}}
    r = post(client, {"model": "jev-latest", "state": "x", "questions": {"q": q}}, path)
    assert r.status_code == 200 and set(r.json()["answers"]["q"]["probabilities"]) == {"true", "false"}
