"""A choice with 59 options over HTTP on the demo model: the TypeSafe answer over all options in the request's
order, usage over both rounds, and the same answer as the plain pipeline; /v1/basal keeps upstream's 2..10."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from basal.core.decision.large_choice import prompt_count
from basal.core.request.dialects import parse_systemone

N = 59
KEYS = [f"intent_{i}" for i in random.Random(0).sample(range(N), N)]  # not sorted: the order must be the request's


def body(n: int = N) -> dict:
    criteria = {k: f"the customer asks about topic {k.split('_')[1]}" for k in KEYS[:n]}
    return {
        "model": "jev-latest",
        "state": "Why was my card declined at the ATM today?",
        "questions": {
            "intent": {"type": "choice", "instructions": "What is the customer asking about?", "criteria": criteria},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        },
    }


def post(client, payload, path="/v1/systemone"):
    return client.post(path, content=json.dumps(payload).encode(), headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def answered(client):
    r = post(client, body())
    assert r.status_code == 200, r.text
    return r.json()


def test_answer_shape_and_option_order(answered):
    answer = answered["answers"]["intent"]
    assert list(answer) == ["type", "choice", "confidence", "probabilities"] and answer["type"] == "choice"
    assert list(answer["probabilities"]) == KEYS
    p = list(answer["probabilities"].values())
    assert abs(sum(p) - 1) < 1e-12 and all(v > 0 for v in p)
    assert answer["choice"] == KEYS[p.index(max(p))]
    assert answer["confidence"] == pytest.approx((max(p) - 1 / N) / (1 - 1 / N), abs=1e-12)
    assert list(answered["answers"]) == ["intent", "urgent"] and set(answered["answers"]["urgent"]) == {"type", "noul"}


def test_usage_counts_both_rounds(answered, engines, demo_model):
    pipeline = engines.engines[demo_model.name].pipeline
    request = parse_systemone(body(), lambda _: demo_model.name)
    rounds = pipeline.admit(request).state
    assert sum(len(t.prompts) for t in rounds.tokenized) == (prompt_count(N) - 2) + 2  # 12 groups, the noul's 2
    first = sum(len(p) for t in rounds.tokenized for p in t.prompts)
    assert answered["usage"]["input_tokens"] > first  # plus the final round's two prompts
    response = pipeline.decide(request)  # the plain path: same prompts, same bits
    assert answered["usage"]["input_tokens"] == response.usage.input_tokens
    assert answered["answers"] == json.loads(msgspec.json.encode(response.answers))


def test_more_than_255_choices_is_the_documented_400(client):
    many = body()
    many["questions"]["intent"]["criteria"] = {f"o{i}": None for i in range(256)}
    r = post(client, many)
    assert (r.status_code, r.json()) == (400, {"detail": "Too many choices. Must have at most 255 choices."})


def test_basal_dialect_keeps_upstreams_limit(client):
    payload = body(11)
    del payload["model"]
    r = post(client, payload, "/v1/basal")
    assert (r.status_code, r.json()) == (422, {"error": "question 'intent': 11 options (supported: 2..10)"})


def test_the_documented_large_choice_example(client, capsys):
    """docs/features.md's curl example builds its body with a python3 one-liner: run it and post what it prints."""
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "features.md").read_text(encoding="utf-8")
    section = page.split("### Choices with 11–255 options", 1)[1]
    code = section.split("python3 -c '", 1)[1].split("')\"", 1)[0]
    exec(compile(code, "docs/features.md", "exec"), {})
    payload = json.loads(capsys.readouterr().out)
    r = post(client, payload)
    assert r.status_code == 200, r.text
    answer = r.json()["answers"]["intent"]
    assert (
        list(answer["probabilities"]) == list(payload["questions"]["intent"]["criteria"])
        and len(answer["probabilities"]) == 15
    )
