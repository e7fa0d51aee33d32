"""`evidence: true` served over HTTP on the demo model (seeded head): the answer's shape and key order on both
dialects, spans as offsets into the request's state (at most 3, clipped before a facts block), upstream's
stub-model test of the flag and the limit, and the refusal where the model has no head."""

from __future__ import annotations

import copy
import json

import pytest

import basal.core.decision.respond as respond_module
from basal.core.decision.evidence import ANSWER_TOP
from tests.api.test_http import post
from tests.conftest import DATA, golden_records

CASES = {c["id"]: c["request"] for c in golden_records("systemone_cases_1.5.jsonl") if "evidence" in json.dumps(c)}
EVIDENCE_VECTORS = [json.loads(line) for line in (DATA / "extensions" / "evidence.jsonl").read_text().splitlines()]
SPAN_KEYS = ["text", "start", "end", "probability"]
BASAL_KEYS = {  # upstream dialect: evidence is the last key
    "noul": ["type", "noul", "probabilities", "confidence", "evidence"],
    "choice": ["type", "choice", "probabilities", "confidence", "evidence"],
    "score": ["type", "score", "legend", "probabilities", "confidence", "evidence"],
    "act": ["type", "action", "expected_costs", "answer", "probabilities", "confidence", "calibration", "evidence"],
}
SYSTEMONE_KEYS = {  # the TypeSafe answers, evidence appended
    "noul": ["type", "noul", "evidence"],
    "choice": ["type", "choice", "confidence", "probabilities", "evidence"],
    "score": ["type", "score", "confidence", "legend", "probabilities", "evidence"],
    "act": BASAL_KEYS["act"],
}


def _state_text(request: dict) -> str:
    state = request["state"]
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def _check_spans(spans: list, state: str, limit: int) -> None:
    assert 1 <= len(spans) <= ANSWER_TOP
    kept: list[tuple[int, int]] = []
    for span in spans:
        assert list(span) == SPAN_KEYS
        assert 0 <= span["start"] < limit and span["end"] <= limit  # offsets into the original state
        assert state[span["start"] : span["end"]] == span["text"] and 0.0 <= span["probability"] <= 1.0
        assert all(span["end"] <= a or span["start"] >= b for a, b in kept)  # no overlap
        kept.append((span["start"], span["end"]))
    probabilities = [s["probability"] for s in spans]
    assert probabilities == sorted(probabilities, reverse=True)  # best first


@pytest.mark.parametrize("dialect", ["basal", "systemone"])
@pytest.mark.parametrize("case_id", sorted(CASES))
def test_served_evidence_shape_key_order_and_offsets(client, demo_model, case_id, dialect):
    request = {**CASES[case_id], "model": "jev-latest" if dialect == "systemone" else demo_model.name}
    r = post(client, request, f"/v1/{dialect}")
    assert r.status_code == 200, r.text
    keys = BASAL_KEYS if dialect == "basal" else SYSTEMONE_KEYS
    state = _state_text(CASES[case_id])
    for name, question in CASES[case_id]["questions"].items():
        answer = r.json()["answers"][name]
        if not question.get("evidence"):
            assert "evidence" not in answer
            continue
        assert list(answer) == keys[question["type"]], list(answer)
        _check_spans(answer["evidence"], state, len(state))  # facts: "auto" -> clipped to the original state


def test_the_facts_block_is_clipped_off(client, demo_model, monkeypatch):
    """With facts "auto" the head also scores the facts block; spans starting there are dropped (on the demo model
    one of the 3 best does, so the answer has 2) and the others end at the original state's end."""
    request = {**CASES["m15-facts-euro-evidence"], "model": demo_model.name}
    unclipped = []
    real = respond_module.best_spans

    def spy(state, rel, ls, le, limit=None):
        unclipped.append((real(state, rel, ls, le), limit))
        return real(state, rel, ls, le, limit)

    monkeypatch.setattr(respond_module, "best_spans", spy)
    answer = post(client, request, "/v1/basal").json()["answers"]["board"]
    ((best, limit),) = unclipped
    assert limit == len(request["state"])
    assert any(s["start"] >= limit for s in best)  # the clipping had something to do
    assert answer["evidence"] == [s for s in best if s["start"] < limit][: len(answer["evidence"])]
    assert all(s["end"] <= limit for s in answer["evidence"])


def test_upstream_stub_test_of_the_flag_and_the_limit(client, monkeypatch):
    """upstream-test/request-flag-and-limit: the span function is stubbed (it returns "trzy miesiące"), the
    request asks for evidence on one question with facts "auto"; the stub sees limit = len(original state)."""
    (v,) = [v for v in EVIDENCE_VECTORS if v["id"] == "upstream-test/request-flag-and-limit"]
    calls = []

    def stub(state, rel, ls, le, limit=None):
        calls.append((state, limit))
        i = state.index("trzy miesiące")
        return [{"text": "trzy miesiące", "start": i, "end": i + 13, "probability": 0.9}]

    monkeypatch.setattr(respond_module, "best_spans", stub)
    body = post(client, v["request"], "/v1/basal").json()
    evidence = body["answers"]["notice"]["evidence"]
    assert evidence[0]["text"] == "trzy miesiące"
    assert v["request"]["state"][evidence[0]["start"] : evidence[0]["end"]] == "trzy miesiące"
    assert "evidence" not in body["answers"]["other"]
    ((state, limit),) = calls
    assert limit == 98 == len(v["request"]["state"]) and state.startswith(v["request"]["state"]) and len(state) > 98


@pytest.mark.parametrize("dialect", ["basal", "systemone"])
def test_a_model_without_a_head_refuses_evidence(headless_client, headless_model, dialect):
    request = {**copy.deepcopy(CASES["m15-evidence-noul"]), "model": headless_model.name}
    r = post(headless_client, request, f"/v1/{dialect}")
    no_head = "evidence is not available for this model (no evidence_head.pt)"
    assert r.status_code == 422
    if dialect == "basal":
        assert r.json() == {"error": no_head}
    else:
        loc = ["body", "questions", "form", "evidence"]
        assert r.json() == {
            "error": "unsupported",
            "detail": [{"type": "unsupported_feature", "loc": loc, "msg": no_head}],
        }
    del request["questions"]["form"]["evidence"]
    assert post(headless_client, request, f"/v1/{dialect}").status_code == 200  # the rest is served as before


def test_the_documented_evidence_curl_example(client):
    """docs/features.md's evidence example, as written there: spans of its state, at the offsets the page shows."""
    page = (DATA.parent.parent / "docs" / "features.md").read_text(encoding="utf-8")
    section = page.split("### Evidence spans (`evidence: true`)")[1].split("\n### ")[0]
    example = section.split("```bash")[1].split("-d '", 1)[1].split("'\n```", 1)[0]
    body = json.loads(example)
    answer = post(client, body, "/v1/basal").json()["answers"]["form"]
    assert list(answer) == BASAL_KEYS["noul"]
    _check_spans(answer["evidence"], body["state"], len(body["state"]))
    shown = json.loads(section.split("```json")[1].split("```")[0])["evidence"][0]
    assert body["state"][shown["start"] : shown["end"]] == shown["text"]
