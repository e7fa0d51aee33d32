"""Request wire types, for the OpenAPI schema only: bodies are validated by `basal.core.contract` (which gives
each dialect its exact status codes and error bodies), so these Structs document, they do not decode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from litestar.openapi.spec import Operation

Entry = str | dict[str, Any] | list[Any]


class NoulCriteria(msgspec.Struct, forbid_unknown_fields=True):
    true: Entry | None = None
    false: Entry | None = None


class NoulQuestion(msgspec.Struct, tag_field="type", tag="noul", forbid_unknown_fields=True):
    instructions: Entry | None = None
    criteria: NoulCriteria | None = None
    evidence: Any = None


class ChoiceQuestion(msgspec.Struct, tag_field="type", tag="choice", forbid_unknown_fields=True):
    criteria: dict[str, Entry | None]
    instructions: Entry | None = None
    option_keys: Literal["show", "hide"] = "show"
    evidence: Any = None


class ScoreQuestion(msgspec.Struct, tag_field="type", tag="score", forbid_unknown_fields=True):
    criteria: list[Entry]
    instructions: Entry | None = None
    evidence: Any = None


class MultiQuestion(msgspec.Struct, tag_field="type", tag="multi", forbid_unknown_fields=True):
    """One yes/no branch per label; the labels whose P(yes) >= threshold, at most `max`, at least `min`."""

    criteria: dict[str, Entry | None] | list[str]
    instructions: Entry | None = None
    threshold: float | None = 0.5
    max: float | None = None
    min: float | None = None
    option_keys: Literal["show", "hide"] = "show"


class ActQuestion(msgspec.Struct, tag_field="type", tag="act", forbid_unknown_fields=True):
    """A readout, then the action of minimum expected cost: costs ``{action: {outcome: cost}}`` or
    ``{"wrong": W, "defer": D}``; `max_error` refuses below the certified confidence of CALIBRATION.json."""

    costs: dict[str, float | dict[str, float]]
    criteria: dict[str, Entry | None] | list[str] | None = None
    instructions: Entry | None = None
    base: Literal["choice", "noul", "score"] | None = None
    option_keys: Literal["show", "hide"] = "show"
    defer_action: str | None = None
    max_error: float | None = None
    evidence: Any = None


class SystemOneRequest(msgspec.Struct):
    """TypeSafe System One request: ``model``, ``state``, ``questions`` (id -> question)."""

    model: str
    state: Entry
    questions: dict[str, NoulQuestion | ChoiceQuestion | ScoreQuestion | MultiQuestion | ActQuestion]


class BasalQuestion(msgspec.Struct):
    type: str = "choice"
    instructions: Any = ""
    criteria: Any = None
    levels: Any = None
    option_keys: Literal["show", "hide"] = "show"


class BasalRequest(msgspec.Struct):
    """Upstream basal-serve request; ``model`` defaults to the server's default model."""

    state: Any
    questions: dict[str, BasalQuestion]
    model: str | None = None


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inline(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


def json_schema(tp: type) -> dict[str, Any]:
    schema = msgspec.json.schema(tp)
    return _inline(schema, schema.get("$defs", {}))


def body_operation(tp: type) -> type[Operation]:
    """An OpenAPI operation whose request body is documented as `tp` (the handler reads the raw body)."""
    body = {"required": True, "content": {"application/json": {"schema": json_schema(tp)}}}

    @dataclass
    class JsonBodyOperation(Operation):
        def to_schema(self) -> dict[str, Any]:
            return {**super().to_schema(), "requestBody": body}

    return JsonBodyOperation
