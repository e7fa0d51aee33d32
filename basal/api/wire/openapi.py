"""The OpenAPI document, true to what the server answers: every status each route can send, with its body and
headers, the Bearer scheme where keys are configured, and the request limits in force.

Litestar documents a handler from its return type only (one 200); the routes here read raw bodies and answer
errors in two dialects, so each operation carries its own request body and responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.openapi.spec import Operation

from basal.api.wire.schema_types import BasalError, SystemOneError, UnsupportedError, json_schema
from basal.core.request.limits import Limits

BEARER = "bearerAuth"
RETRY_HEADERS = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}},
    "retry-after-ms": {"description": "milliseconds to wait before retrying", "schema": {"type": "string"}},
}
ANSWER_HEADERS = {
    name: {"description": text, "required": True, "schema": {"type": "string"}}
    for name, text in (
        ("x-request-id", "request id"),
        ("x-basal-queue-ms", "time waited for the device"),
        ("x-basal-compute-ms", "time of the batch that answered it"),
    )
}

WARNINGS_HEADER = {
    "x-basal-warnings": {
        "description": "what the request sent that was ignored (misspelled fields, unknown types); at most 1 KiB",
        "schema": {"type": "string"},
    }
}
README_QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments, invoicing, refunds", "technical": "Bugs, outages"},
    },
}
REQUEST_EXAMPLES = {  # every example is answered 200 (tests/api/test_openapi_docs.py posts each one)
    "systemone": {
        "noul-and-choice": {
            "summary": "a yes/no question and a choice (the README's request)",
            "value": {
                "model": "jev-latest",
                "state": "Help! My payouts have been failing for 3 days.",
                "questions": README_QUESTIONS,
            },
        },
        "score-on-a-json-state": {
            "summary": "a score over levels, the state a JSON object",
            "value": {
                "model": "jev-latest",
                "state": {"ticket": "Paczka dotarła uszkodzona", "amount": 129.99},
                "questions": {
                    "urgency": {
                        "type": "score",
                        "instructions": "Jak pilne?",
                        "criteria": ["niska", "średnia", "wysoka"],
                    }
                },
            },
        },
    },
    "basal": {
        "noul-and-choice": {
            "summary": "the default model; a choice's type may be left out",
            "value": {
                "state": "Help! My payouts have been failing for 3 days.",
                "questions": {
                    "urgent": README_QUESTIONS["urgent"],
                    "team": {"instructions": "Which team?", "criteria": ["billing", "technical"]},
                },
            },
        },
        "score-with-levels": {
            "summary": "a score over levels",
            "value": {
                "state": "Server room temperature is 41 C and rising.",
                "questions": {
                    "alarm": {"type": "score", "instructions": "How severe?", "criteria": ["minor", "critical"]}
                },
            },
        },
    },
}


def json_content(tp: Any) -> dict[str, Any]:
    """An OpenAPI `content` of one JSON body of type `tp`."""
    return {"application/json": {"schema": json_schema(tp)}}


def _json(description: str, tp: Any, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": tp if isinstance(tp, dict) else json_schema(tp)}},
    }
    if headers:
        response["headers"] = headers
    return response


def decision_responses(dialect: str, answer: type, keys: bool) -> dict[str, Any]:
    """Every status a decision route sends (499 goes to logs and metrics only: its client has left)."""
    error: Any = BasalError if dialect == "basal" else SystemOneError
    responses = {
        "200": _json("the answers", answer, ANSWER_HEADERS | (WARNINGS_HEADER if dialect == "basal" else {})),
        "400": _json("a semantic limit (Jev's 400 bodies) or a body that does not decompress", error),
        "413": _json("the body (or its decompressed form) is over the size limit", error),
        "415": _json("Content-Type is not application/json, or Content-Encoding is unknown", error),
        "422": _json(
            "the body does not validate"
            if dialect == "basal"
            else "the body does not validate, or uses a feature not supported yet",
            error if dialect == "basal" else {"anyOf": [json_schema(SystemOneError), json_schema(UnsupportedError)]},
        ),
        "503": _json("the server is shutting down", error, RETRY_HEADERS),
        "529": _json("too many requests in flight", error, RETRY_HEADERS),
    }
    if keys:
        responses["401"] = _json("wrong API key", error)
        responses["403"] = _json("no API key", error)
    return dict(sorted(responses.items()))


def request_schema(tp: type, limits: Limits) -> dict[str, Any]:
    schema = json_schema(tp)
    schema["properties"]["questions"]["maxProperties"] = limits.max_questions
    return schema


DIAGNOSTICS_PARAMETER = {
    "name": "x-basal-diagnostics",
    "in": "header",
    "required": False,
    "description": "1 or true: the 200 body ends with one more member, `diagnostics` (each question's per-order "
    "distributions with each order's letter mass over the whole vocabulary, their average, the temperature and the "
    "calibrated result, the facts block, prompt and packed tokens; docs/playground.md). Absent, 0 or false: the "
    "body is unchanged.",
    "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
}


def documented(
    responses: dict[str, Any],
    body: dict[str, Any] | None = None,
    secured: bool = False,
    examples: dict[str, Any] | None = None,
    parameters: list[dict[str, Any]] | None = None,
    media_type: str = "application/json",
) -> type[Operation]:
    """An OpenAPI operation with exactly these responses (and request body with examples, header parameters, and
    Bearer security)."""
    extra: dict[str, Any] = {"responses": responses}
    if parameters:
        extra["parameters"] = parameters
    if body is not None:
        media: dict[str, Any] = {"schema": body}
        if examples:
            media["examples"] = examples
        extra["requestBody"] = {"required": True, "content": {media_type: media}}
    if secured:
        extra["security"] = [{BEARER: []}]

    @dataclass
    class DocumentedOperation(Operation):
        def to_schema(self) -> dict[str, Any]:
            return {**super().to_schema(), **extra}

    return DocumentedOperation
