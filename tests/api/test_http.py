"""The HTTP surface: answers and headers, every documented error with its status and body, bodies (size,
compression), auth, models, health, metrics, OpenAPI."""

from __future__ import annotations

import asyncio
import gzip
import json

import msgspec
import pytest
import zstandard
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.routes import decisions as handling
from basal.api.settings import ApiSettings
from tests.servers import make_engines

REQUEST = {
    "model": "jev-latest",
    "state": {"ticket": "Paczka dotarła uszkodzona", "amount": 129.99},
    "questions": {
        "kind": {
            "type": "choice",
            "instructions": "Rodzaj?",
            "criteria": {"damage": "Uszkodzenie", "late": "Opóźnienie", "other": None},
        },
        "refund": {"type": "noul", "instructions": "Czy zwrot?"},
        "urgency": {"type": "score", "instructions": "Jak pilne?", "criteria": ["niska", "wysoka"]},
    },
}
SERVED = (
    "(served: basal-synthetic-demo; aliases jev-latest, jev-preview -> basal-synthetic-demo; GET /v1/models lists them)"
)


def post(client, body, path="/v1/systemone", **headers):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"content-type": "application/json", **headers})


def test_systemone_answer_and_headers(client):
    r = post(client, REQUEST)
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "basal-synthetic-demo" and list(body["answers"]) == ["kind", "refund", "urgency"]
    assert set(body["answers"]["refund"]) == {"type", "noul"}
    assert list(body["answers"]["kind"]) == ["type", "choice", "confidence", "probabilities"]
    assert body["answers"]["urgency"]["legend"] == {"0": "niska", "1": "wysoka"}
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
    for h in ("x-basal-queue-ms", "x-basal-compute-ms", "x-basal-total-ms"):
        assert float(r.headers[h]) >= 0
    assert int(r.headers["x-basal-batch-requests"]) >= 1
    assert r.headers["x-typesafe-request-id"].startswith("req_") and len(r.headers["x-request-id"]) == 36


def test_basal_dialect_defaults_model_and_answers_upstream_shape(client):
    r = post(client, {"state": "x", "questions": {"a": {"criteria": ["yes", "no"]}}}, "/v1/basal")
    assert r.status_code == 200
    answer = r.json()["answers"]["a"]
    assert list(answer) == ["type", "choice", "probabilities", "confidence"]
    assert answer["confidence"] == max(answer["probabilities"].values())
    assert set(r.json()["usage"]) == {"input_tokens", "output_tokens", "questions", "branches", "latency_ms"}


@pytest.mark.parametrize(
    ("body", "status", "check"),
    [
        (
            {**REQUEST, "model": "gpt-9"},
            400,
            lambda b: b == {"detail": {"error_type": "api_usage_error", "message": f"Unknown model: gpt-9 {SERVED}"}},
        ),
        (
            {**REQUEST, "questions": {"q": {"type": "noul", "instructions": "?", "typo": 1}}},
            422,
            lambda b: b["detail"][0]["type"] == "extra_forbidden",
        ),
        (
            {**REQUEST, "questions": {"q": {"type": "score", "criteria": list("abcdefghijk")}}},
            400,
            lambda b: b == {"detail": "Too many score levels. Must have at most 10 levels."},
        ),
        (
            {**REQUEST, "questions": {"q": {"type": "choice", "criteria": {}}}},
            400,
            lambda b: b == {"detail": "Choice question must have at least one choice: q"},
        ),
        ({**REQUEST, "questions": {}}, 422, lambda b: b["detail"][0]["type"] == "too_short"),
        ({"state": "x"}, 422, lambda b: [e["loc"] for e in b["detail"]] == [["body", "model"], ["body", "questions"]]),
        (b"{not json", 422, lambda b: b["detail"][0]["type"] == "json_invalid"),
        (
            {**REQUEST, "questions": {"q": {"type": "choice", "criteria": {"only": None}, "evidence": True}}},
            422,
            lambda b: b["error"] == "unsupported" and b["detail"][0]["msg"] == "evidence needs 2 to 10 options",
        ),
    ],
)
def test_systemone_errors(client, body, status, check):
    r = post(client, body)
    assert r.status_code == status and check(r.json()), r.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[]", "the request body must be a JSON object"),
        (
            {"state": "x", "questions": {"q": {"type": "score", "criteria": ["a"]}}},
            "question 'q': 1 options (supported: 2..10)",
        ),
        ({"model": "nope", "state": "x", "questions": {}}, f"unknown model: nope {SERVED}"),
    ],
)
def test_basal_dialect_errors_are_422_error(client, body, message):
    r = post(client, body, "/v1/basal")
    assert (r.status_code, r.json()) == (422, {"error": message})


def test_compressed_bodies(client):
    raw = json.dumps(REQUEST).encode()
    plain = post(client, raw).json()["answers"]
    assert post(client, gzip.compress(raw), **{"content-encoding": "gzip"}).json()["answers"] == plain
    assert (
        post(client, zstandard.ZstdCompressor().compress(raw), **{"content-encoding": "zstd"}).json()["answers"]
        == plain
    )
    r = post(client, raw, **{"content-encoding": "br"})
    assert r.status_code == 415 and "Content-Encoding" in r.json()["detail"]
    assert post(client, b"not gzip", **{"content-encoding": "gzip"}).status_code == 400


def test_oversized_bodies_are_413(client):
    huge = {**REQUEST, "state": "x" * (2 << 20)}
    assert post(client, huge).status_code == 413
    bomb = zstandard.ZstdCompressor().compress(json.dumps({**REQUEST, "state": "a" * (3 << 20)}).encode())
    assert len(bomb) < 1 << 20
    r = post(client, bomb, **{"content-encoding": "zstd"})
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]


def test_models_health_404_openapi(client):
    models = client.get("/v1/models").json()["models"]
    assert [m["name"] for m in models] == ["basal-synthetic-demo"] and models[0]["release_date"] == "2026-10-05"
    assert client.get("/health").json() == {
        "status": "ok",
        "models": ["basal-synthetic-demo"],
        "default_model": "basal-synthetic-demo",
    }
    r = client.get("/nope")
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    assert client.get("/v1/systemone").status_code == 405
    schema = client.get("/schema/openapi.json").json()
    body = schema["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["model", "state", "questions"]
    assert "SystemOneResponse" in json.dumps(
        schema["paths"]["/v1/systemone"]["post"]["responses"]
    ) or "answers" in json.dumps(schema)


def test_metrics_are_opt_in(client, demo_model):
    post(client, REQUEST)
    text = client.get("/metrics").text
    for series in (
        "basal_http_requests_total",
        "basal_queue_duration_seconds_bucket",
        "basal_batch_requests",
        "basal_input_tokens_total",
        "basal_packed_tokens_total",
        "basal_prompt_tokens_total",
        "basal_max_inflight_requests 1024",
    ):
        assert series in text
    assert 'status="200"' in text and 'lane="main"' in text
    with TestClient(create_app(make_engines(demo_model), ApiSettings(metrics=False))) as off:
        r = off.get("/metrics")
        assert r.status_code == 404 and "start the server with basal serve --metrics" in r.json()["detail"]


def test_api_keys(demo_model):
    with TestClient(create_app(make_engines(demo_model), ApiSettings(api_keys=("s3cret",)))) as c:
        r = post(c, REQUEST)
        assert r.status_code == 403 and r.json()["detail"]["error_type"] == "authentication_error"
        r = post(c, REQUEST, authorization="Bearer wrong")
        assert r.status_code == 401 and "API key" in r.json()["detail"]["message"]
        assert post(c, REQUEST, authorization="Bearer s3cret").status_code == 200
        assert post(c, {"state": "x", "questions": {}}, "/v1/basal").json() == {
            "error": "Must supply an API key! Check your request and try again."
        }
        assert c.get("/v1/models").status_code == 403 and c.get("/health").status_code == 200


def test_answers_are_msgspec_encoded_floats(client):
    r = post(client, REQUEST)
    assert msgspec.json.decode(r.content) == r.json()


def test_the_readme_curl_example(client):
    """The request of the README's quick start, as written there."""
    body = {
        "model": "jev-latest",
        "state": "Help! My payouts have been failing for 3 days.",
        "questions": {
            "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": {"billing": "Payments, invoicing, refunds", "technical": "Bugs, outages"},
            },
        },
    }
    r = post(client, body)
    assert r.status_code == 200 and set(r.json()["answers"]) == {"urgent", "team"}
    assert r.json()["answers"]["team"]["choice"] in ("billing", "technical")


def _where() -> str:
    try:
        asyncio.get_running_loop()
        return "loop"
    except RuntimeError:
        return "thread"


def test_large_and_compressed_bodies_are_decoded_off_the_event_loop(client, monkeypatch):
    seen = []
    decode = handling.decode_body
    monkeypatch.setattr(
        handling, "decode_body", lambda body, dialect: (seen.append(_where()), decode(body, dialect))[1]
    )
    assert post(client, REQUEST).status_code == 200
    assert post(client, {**REQUEST, "state": "x " * 50_000}).status_code == 422  # context_length_exceeded
    assert post(client, gzip.compress(json.dumps(REQUEST).encode()), **{"content-encoding": "gzip"}).status_code == 200
    assert seen == ["loop", "thread", "thread"]


def test_a_large_request_that_needs_no_model_is_answered_off_the_event_loop(client, engines, monkeypatch):
    pipeline = engines.engines["basal-synthetic-demo"].pipeline
    seen = []
    respond = pipeline.respond
    monkeypatch.setattr(pipeline, "respond", lambda *a: (seen.append(_where()), respond(*a))[1])
    one_option = {"type": "choice", "instructions": "?" * 200, "criteria": {"only": None}}
    body = {**REQUEST, "questions": {f"q{i}": one_option for i in range(100)}}
    r = post(client, body)
    assert r.status_code == 200 and r.json()["answers"]["q7"]["choice"] == "only"
    assert seen == ["thread"]


def test_openapi_is_true_to_the_configuration(demo_model):
    with TestClient(create_app(make_engines(demo_model), ApiSettings(api_keys=("k",), metrics=False))) as c:
        schema = c.get("/schema/openapi.json", headers={"authorization": "Bearer k"}).json()
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key",
    }
    op = schema["paths"]["/v1/systemone"]["post"]
    assert op["security"] == [{"bearerAuth": []}]
    assert {"200", "400", "401", "403", "413", "415", "422", "503", "529"} <= set(op["responses"])
    body = op["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["questions"]["minProperties"] == 1
    assert body["properties"]["questions"]["maxProperties"] == 1024
    assert set(schema["paths"]["/metrics"]["get"]["responses"]) == {"404"}


def test_cors_when_origins_are_configured(demo_model):
    settings = ApiSettings(cors_origins=("https://app.example",))
    with TestClient(create_app(make_engines(demo_model), settings)) as c:
        r = c.options(
            "/v1/systemone",
            headers={"origin": "https://app.example", "access-control-request-method": "POST"},
        )
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = c.options(
            "/v1/systemone", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
        )
        assert r.headers.get("access-control-allow-origin") != "https://evil.example"
