"""`POST /v1/decisions` spoken by a client written from vLLM's documents, not from basal's structs: the request of
`docs/serving/online_serving/decisions.md` (commit 0c47dea5) and the answers, usage and errors of
`vllm/entrypoints/openai/decisions/protocol.py` and `api_router.py` (commit 09e6fa5e), over plain httpx."""

from __future__ import annotations

import math

import httpx
import pytest

MODEL = "basal-synthetic-demo"
INPUT = "The package arrived with a broken screen."
QUESTIONS = [  # decisions.md's example, as written there
    {"type": "predicate", "name": "damaged", "instructions": "Does the customer report a damaged item?"},
    {
        "type": "choice",
        "name": "department",
        "instructions": "Which department should handle this complaint?",
        "choices": [{"value": "returns"}, {"value": "billing"}],
    },
    {
        "type": "score",
        "instructions": "How severe is the damage?",
        "levels": [{"label": "cosmetic"}, {"label": "broken"}],
    },
]


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/decisions", json=body, timeout=60)


def test_the_documented_example_is_answered_in_question_order(server):
    url, _ = server
    reply = _post(url, {"model": MODEL, "input": INPUT, "questions": QUESTIONS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert list(body) == ["model", "answers", "usage"] and body["model"] == MODEL
    damaged, department, severity = body["answers"]
    assert damaged == {"type": "predicate", "name": "damaged", "probability": damaged["probability"]}
    assert 0 <= damaged["probability"] <= 1
    assert list(department) == ["type", "name", "choice", "probabilities", "confidence"]
    assert department["name"] == "department" and department["choice"] in ("returns", "billing")
    assert [p["value"] for p in department["probabilities"]] == ["returns", "billing"]
    assert math.isclose(sum(p["probability"] for p in department["probabilities"]), 1, abs_tol=1e-6)
    top = max(department["probabilities"], key=lambda p: p["probability"])
    assert department["choice"] == top["value"] and department["confidence"] == top["probability"]
    assert severity["type"] == "score" and severity["name"] is None  # unnamed: null, as vLLM echoes it
    levels = severity["probabilities"]
    assert [(p["value"], p["label"]) for p in levels] == [(0, "cosmetic"), (1, "broken")]
    assert math.isclose(severity["score"], sum(p["value"] * p["probability"] for p in levels), rel_tol=1e-12)
    usage = body["usage"]
    assert set(usage) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert set(usage["input_tokens_details"]) == {"cached_tokens", "cache_write_tokens"}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}


def test_the_answers_are_the_bits_of_the_same_questions_on_v1_basal(server):
    """The same engine and prompts: each probability is the one `/v1/basal` gives for the same question."""
    url, _ = server
    messages = [
        {"role": "user", "content": [{"type": "input_text", "text": "Paid twice."}]},
        {"role": "user", "content": "Refund?"},
    ]
    questions = [
        {"type": "predicate", "instructions": "Is a refund asked for?"},
        {
            "type": "choice",
            "instructions": "Which?",
            "choices": [{"value": True}, {"value": "maybe", "description": "unsure"}],
        },
        {
            "type": "score",
            "instructions": "How urgent?",
            "levels": [{"label": "low"}, {"label": "mid"}, {"label": "high"}],
        },
    ]
    ours = _post(url, {"model": MODEL, "input": messages, "questions": questions}).json()["answers"]
    native = httpx.post(
        f"{url}/v1/basal",
        json={
            "model": MODEL,
            "state": "Paid twice.\n\nRefund?",  # messages apart by a blank line, as vLLM joins them
            "questions": {
                "a": {"type": "noul", "instructions": "Is a refund asked for?"},
                "b": {"type": "choice", "instructions": "Which?", "criteria": {"true": None, "maybe": "unsure"}},
                "c": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
            },
        },
        timeout=60,
    ).json()["answers"]
    assert ours[0]["probability"] == native["a"]["noul"]
    assert [p["probability"] for p in ours[1]["probabilities"]] == list(native["b"]["probabilities"].values())
    assert ours[1]["probabilities"][0]["value"] is True  # a boolean value stays a boolean
    assert [p["probability"] for p in ours[2]["probabilities"]] == list(native["c"]["probabilities"].values())


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model": MODEL, "input": INPUT, "questions": QUESTIONS, "stream": True}, 400, "stream"),  # unknown field
        ({"model": "Qwen/Qwen3-0.6B", "input": INPUT, "questions": QUESTIONS}, 404, "does not exist"),
        ({"model": MODEL, "input": INPUT, "questions": []}, 400, "questions"),
        ({"model": MODEL, "input": INPUT, "questions": [{**QUESTIONS[0], "name": None}]}, 400, "name"),
        (
            {"model": MODEL, "input": INPUT, "questions": [{**QUESTIONS[1], "choices": [{"value": "x"}]}]},
            400,
            "choices",
        ),
        (
            {
                "model": MODEL,
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}],
                "questions": QUESTIONS,
            },
            400,
            "input",
        ),
        (
            {
                "model": MODEL,
                "input": INPUT,
                "questions": [{**QUESTIONS[1], "choices": [{"value": True}, {"value": "true"}]}],
            },
            400,
            "distinct",
        ),
        (
            {
                "model": MODEL,
                "input": INPUT,
                "questions": [{**QUESTIONS[1], "choices": [{"value": str(i)} for i in range(11)]}],
            },
            400,
            "'questions[0]': 11 options",
        ),
    ],
)
def test_refusals_are_vllms_error_envelope(server, body, status, words):
    url, _ = server
    reply = _post(url, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert words in error["message"] and error["type"].endswith("Error")


def test_a_body_that_is_not_json_is_a_400(server):
    url, _ = server
    reply = httpx.post(f"{url}/v1/decisions", content=b"{", headers={"content-type": "application/json"}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == 400


def test_the_route_is_in_the_openapi_document(client):
    operation = client.get("/schema/openapi.json").json()["paths"]["/v1/decisions"]["post"]
    assert {"200", "400", "404"} <= set(operation["responses"])
    assert set(operation["requestBody"]["content"]["application/json"]["schema"]["required"]) == {
        "model",
        "input",
        "questions",
    }


def test_the_documented_example_is_answered(client):
    example = client.get("/schema/openapi.json").json()["paths"]["/v1/decisions"]["post"]["requestBody"]
    body = example["content"]["application/json"]["examples"]["decisions-md"]["value"]
    reply = client.post("/v1/decisions", json=body)
    assert reply.status_code == 200, reply.text
    assert [a["name"] for a in reply.json()["answers"]] == ["damaged", "department", None]
