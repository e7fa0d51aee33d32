"""A prompt longer than the model's positions: /v1/systemone answers the TypeSafe dialect's
`context_length_exceeded` per question (a multi once, under its name); /v1/basal keeps its 422 message."""

from __future__ import annotations

from tests.api.test_http import post


def _long_state(demo_model, tokens: int) -> str:
    state = "zwrot " * tokens
    assert len(demo_model.tokenizer.encode(state)) > demo_model.config.max_position_embeddings
    return state


def test_typesafe_reports_each_question_over_the_context_once(client, demo_model):
    limit = demo_model.config.max_position_embeddings
    body = {
        "model": "jev-latest",
        "state": _long_state(demo_model, limit + 200),
        "questions": {
            "tags": {"type": "multi", "instructions": "Które?", "criteria": ["a", "b"]},
            "ok": {"type": "noul", "instructions": "Czy?"},
        },
    }
    r = post(client, body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert r.json()["error"] == "unsupported" and [d["loc"] for d in detail] == [
        ["body", "questions", "tags"],
        ["body", "questions", "ok"],
    ]
    assert all(d["type"] == "context_length_exceeded" and list(d) == ["type", "loc", "msg"] for d in detail)
    n = int(detail[0]["msg"].split()[3])
    assert n > limit and detail[0]["msg"] == (
        f"the prompt has {n} tokens, more than the maximum context length of {limit} tokens of model {demo_model.name}"
    )


def test_basal_dialect_keeps_its_message(client, demo_model):
    state = _long_state(demo_model, demo_model.config.max_position_embeddings + 200)
    r = post(client, {"state": state, "questions": {"q": {"type": "noul", "instructions": "Czy?"}}}, "/v1/basal")
    assert r.status_code == 422 and "tokens; the model reads at most" in r.json()["error"]
