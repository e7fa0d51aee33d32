"""multi, act and evidence over HTTP: every request_error vector on its dialect, upstream's stub-model tests, and
the e2e requests on the demo model (shapes, key order, usage; their answers through the decision logic)."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.core.decision.act import choose_action
from basal.core.decision.multi import multi_answer
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import Calibration
from basal.core.request.dialects import parse_basal
from tests.api.test_http import post
from tests.conftest import DATA
from tests.stub_backend import StubBackend

REFUSALS = {  # the vectors of the other files that concern multi/act/evidence validation
    "upstream-test/refused-without-head",
    "errors/upstream/evidence-multi",
    "errors/typesafe/evidence-no-head",
    "errors/typesafe/act-11-options",
    "errors/typesafe/evidence-on-large-choice",
}
VECTORS = [
    v
    for name in ("multi_act.jsonl", "evidence.jsonl", "large_choice.jsonl")
    for v in map(json.loads, (DATA / "extensions" / name).read_text().splitlines())
    if name == "multi_act.jsonl" or v["id"] in REFUSALS
]
OPTIONAL = {"max_error", "refused"}  # act keys that depend on the model's numbers


def _of(kind: str) -> list[dict]:
    return [v for v in VECTORS if v["kind"] == kind]


def _served(request: dict, name: str) -> dict:
    return {**request, "model": name} if "model" in request else request


@pytest.mark.parametrize("v", _of("request_error"), ids=lambda v: v["id"])
def test_request_error_vectors(client, headless_client, demo_model, v):
    """The demo model has an evidence head; a vector for a model without one runs on the headless copy."""
    assert sum(x["id"] in REFUSALS for x in VECTORS) == len(REFUSALS)  # every refusal vector was found
    path = "/v1/systemone" if v["dialect"] == "typesafe" else "/v1/basal"
    served = headless_client if v.get("precondition") == "model without evidence head" else client
    r = post(served, _served(v["request"], demo_model.name), path)
    expected = v["expected"]["body"]
    assert r.status_code == v["expected"]["status"], r.text
    assert r.json() == expected and r.text == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))


def test_typesafe_collects_every_extension_error(client, demo_model):
    body = {
        "model": demo_model.name,
        "state": "x",
        "questions": {
            "a": {
                "type": "act",
                "criteria": {"true": "T"},
                "costs": {"ok": {"true": 1, "false": "2"}},
                "max_error": "1",
            },
            "m": {"type": "multi", "criteria": ["a", 3], "threshold": True, "evidence": True},
        },
    }
    r = post(client, body)
    assert r.status_code == 422
    assert [(d["type"], d["loc"][2:]) for d in r.json()["detail"]] == [
        ("value_error", ["m", "evidence"]),
        ("float_type", ["a", "act", "costs", "ok", "false"]),
        ("float_type", ["a", "act", "max_error"]),
        ("string_type", ["m", "multi", "criteria", "1"]),
        ("float_type", ["m", "multi", "threshold"]),
    ]


# -- upstream's tests with a stub model ------------------------------------------------------------------------

RULES = {
    "upstream-test/act-min-expected-cost-defer": lambda prompt, k: (
        [0.962, 0.038] if "A. Przysługuje" in prompt else [0.038, 0.962]
    ),
    "upstream-test/act-short-form": lambda prompt, k: [0.9, 0.1],
    "upstream-test/soam-branches": lambda prompt, k: [0.6, 0.3, 0.1][:k],
}


def _stub_client(demo_model, rule, calibration: Calibration | None = None):
    model = dataclasses.replace(demo_model, calibration=calibration or Calibration())
    metrics = Metrics(16)
    engine = Engine(model.name, Pipeline(model, StubBackend(model, rule)), Gate(100.0), metrics, EngineSettings())
    return TestClient(create_app(Engines({model.name: engine}, model.name, metrics, 16)))


def _at(body: dict, path: str):
    for part in path.split("."):
        body = body[part]
    return body


@pytest.mark.parametrize("v", _of("server_stub"), ids=lambda v: v["id"])
def test_server_stub_vectors(demo_model, v):
    if v["id"] not in RULES:  # the evidence refusal: a model without a head, no rule needed
        rule = lambda prompt, k: [1.0 / k] * k  # noqa: E731
        with _stub_client(demo_model, rule) as c:
            r = post(c, v["request"], "/v1/basal")
        assert (r.status_code, r.json()) == (422, json.loads(v["asserts"][0]["http"].split(" ", 1)[1]))
        return
    with _stub_client(demo_model, RULES[v["id"]]) as c:
        body = post(c, v["request"], "/v1/basal").json()
    for check in v["asserts"]:
        if check["op"] == "eq":
            assert _at(body, check["path"]) == check["value"], check
        elif check["op"] == "approx":
            assert abs(_at(body, check["path"]) - check["value"]) <= check["tol"], check
    if "derived_answer_f64" in v:
        (answer,) = body["answers"].values()
        want = v["derived_answer_f64"]
        assert list(answer) == list(want)
        for key in ("type", "action", "answer", "calibration"):
            assert answer[key] == want[key]
        for key, tol in (("expected_costs", 1e-4), ("probabilities", 1e-6)):  # float32 stub logits: p ± 1e-8
            assert list(answer[key]) == list(want[key])
            assert all(abs(answer[key][k] - want[key][k]) <= tol for k in want[key])


def test_upstream_refuses_evidence_after_an_act_that_could_fail(demo_model):
    """Upstream order: the act's refusal without a defer action is raised first; if it does not fire, evidence."""
    questions = {
        "e": {"type": "noul", "instructions": "?", "evidence": True},
        "a": {"type": "act", "costs": {"x": {"true": 0, "false": 1}, "y": {"true": 1, "false": 0}}, "max_error": 0.01},
    }
    thresholds = {"0.01": {"confidence": 0.8}}
    for p_true, error in [(0.6, "max_error needs a defer action"), (0.9, "evidence is not available")]:
        rule = lambda prompt, k, p=p_true: [p, 1 - p] if "A. Tak" in prompt or "A. Yes" in prompt else [1 - p, p]  # noqa: E731
        with _stub_client(demo_model, rule, Calibration({}, thresholds)) as c:
            r = post(c, {"state": "s", "questions": questions}, "/v1/basal")
        assert r.status_code == 422 and r.json()["error"].startswith(error), r.text


def test_typesafe_refusal_without_defer_action(demo_model):
    question = {"type": "act", "costs": {"x": {"true": 0, "false": 1}}, "max_error": 0.01}
    with _stub_client(demo_model, lambda prompt, k: [0.5, 0.5], Calibration({}, {"0.01": {"confidence": 0.9}})) as c:
        r = post(c, {"model": demo_model.name, "state": "s", "questions": {"r": question}})
    assert r.status_code == 422
    assert r.json() == {
        "detail": [
            {
                "type": "value_error",
                "loc": ["body", "questions", "r"],
                "msg": 'max_error needs a defer action ("defer"/"human" or defer_action)',
            }
        ]
    }


# -- e2e requests on the demo model ----------------------------------------------------------------------------


@pytest.mark.parametrize("v", _of("e2e_model"), ids=lambda v: v["id"])
def test_e2e_requests_on_the_demo_model(client, demo_model, v):
    request = _served(v["request"], demo_model.name)
    want = v["expected"]
    for path in ("/v1/basal", "/v1/systemone"):
        r = post(client, request, path)
        assert r.status_code == 200, r.text
        body = r.json()
        assert list(body["answers"]) == list(want["answers"])
        for name, answer in body["answers"].items():
            expected = want["answers"][name]
            if expected["type"] in ("multi", "act"):  # the same shape in both dialects
                assert [k for k in answer if k not in OPTIONAL] == [k for k in expected if k not in OPTIONAL]
                assert list(answer["probabilities"]) == list(expected["probabilities"])
        if path == "/v1/basal":
            usage = body["usage"]
            assert (usage["questions"], usage["branches"]) == (want["usage"]["questions"], want["usage"]["branches"])
            assert usage["input_tokens"] > 0


def _certified(expected: dict) -> dict:
    """A CALIBRATION.json threshold consistent with the recorded answer (the release values are unknown)."""
    if "refused" in expected:
        return {"confidence": min(1.0, expected["confidence"] + 0.05)}
    return {"confidence": max(0.0, expected["confidence"] - 0.05)}


@pytest.mark.parametrize("v", _of("e2e_model"), ids=lambda v: v["id"])
def test_e2e_answers_from_the_recorded_probabilities(v):
    plan = parse_basal(v["request"], lambda _name: "m")
    checked = 0
    for q in plan.questions:
        expected = v["expected"]["answers"][q.name]
        if q.kind == "multi":
            answer = json.loads(msgspec.json.encode(multi_answer(expected["probabilities"], q.spec)))
        elif q.kind == "act":
            key = q.spec.max_error_key
            thresholds = {} if key is None or "max_error" in expected else {key: _certified(expected)}
            answer = json.loads(msgspec.json.encode(choose_action(expected["probabilities"], q.spec, thresholds, True)))
        else:
            continue
        assert answer == expected and list(answer) == list(expected)
        checked += 1
    assert checked >= 1


def test_models_describe_the_types_each_model_answers(client, headless_client):
    (model,) = client.get("/v1/models").json()["models"]
    assert model["types"] == ["choice", "noul", "score", "multi", "act"]
    assert model["evidence"] is True and model["calibrated"] is True  # the demo model has an evidence head
    assert [m["evidence"] for m in headless_client.get("/v1/models").json()["models"]] == [False]
    assert model["certified_max_error"] == ["0.01", "0.05"]  # the demo's CALIBRATION.json thresholds
    assert "act / multi" in model["description"]


def test_the_documented_extension_curl_examples(client):
    """Every curl example of docs/features.md's multi / act section, as written there."""
    page = (DATA.parent.parent / "docs" / "features.md").read_text(encoding="utf-8")
    section = page.split("## basal-1.5 extensions: `multi` and `act`")[1].split("\n## ")[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```bash")[1:]]
    examples = [block.split("-d '", 1)[1].rsplit("'", 1)[0] for block in blocks]
    assert len(examples) == 2
    for example in examples:
        path = "/v1/systemone" if '"model": "jev-latest"' in example else "/v1/basal"
        r = post(client, json.loads(example), path)
        assert r.status_code == 200, r.text
        assert {a["type"] for a in r.json()["answers"].values()} <= {"multi", "act"}


def test_multi_and_act_beside_a_large_choice(client, demo_model):
    """A multi's branches and an act share round 1 with the groups of an 11+-option choice."""
    questions = {
        "big": {"type": "choice", "instructions": "Which?", "criteria": {f"o{i}": f"option {i}" for i in range(12)}},
        "tags": {"type": "multi", "instructions": "Which apply?", "criteria": ["a", "b", "c"], "min": 1},
        "route": {"type": "act", "costs": {"wrong": 3, "defer": 1}},
    }
    r = post(client, {"model": demo_model.name, "state": "Order 42 was late.", "questions": questions})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert answers["big"]["choice"] in questions["big"]["criteria"]
    assert list(answers["tags"]["probabilities"]) == ["a", "b", "c"] and len(answers["tags"]["selected"]) >= 1
    assert answers["route"]["action"] in ("true", "false", "defer")
