"""Wire types, for the OpenAPI schema only: bodies are validated by `basal.core.request.dialects` (which gives each
dialect its exact status codes and error bodies), so these Structs document, they do not decode."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from basal.core.request.dialects import MAX_CHOICES, MAX_LEVELS

Entry = str | dict[str, Any] | list[Any]


class NoulCriteria(msgspec.Struct, forbid_unknown_fields=True):
    true: Entry | None = None
    false: Entry | None = None


class NoulQuestion(msgspec.Struct, tag_field="type", tag="noul", forbid_unknown_fields=True):
    instructions: Entry | None = None
    criteria: NoulCriteria | None = None
    evidence: Any = None


class ChoiceQuestion(msgspec.Struct, tag_field="type", tag="choice", forbid_unknown_fields=True):
    criteria: Annotated[dict[str, Entry | None], msgspec.Meta(min_length=1, max_length=MAX_CHOICES)]
    instructions: Entry | None = None
    option_keys: Literal["show", "hide"] = "show"
    evidence: Any = None


class ScoreQuestion(msgspec.Struct, tag_field="type", tag="score", forbid_unknown_fields=True):
    criteria: Annotated[list[Entry], msgspec.Meta(min_length=1, max_length=MAX_LEVELS)]
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


SystemOneQuestion = NoulQuestion | ChoiceQuestion | ScoreQuestion | MultiQuestion | ActQuestion


class SystemOneRequest(msgspec.Struct):
    """TypeSafe System One request: ``model``, ``state``, ``questions`` (id -> question)."""

    model: str
    state: Entry
    questions: Annotated[dict[str, SystemOneQuestion], msgspec.Meta(min_length=1)]


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


class ServedModel(msgspec.Struct):  # the front's own facts about a model are `core.engine.front.ModelInfo`
    """One served model, as `GET /v1/models` lists it."""

    name: str
    release_date: str
    description: str
    mode: str
    early_exit: list[str]
    synthetic: bool = False  # random weights: the answers have the right shapes and carry no meaning


class ModelsResponse(msgspec.Struct):
    models: list[ServedModel]


class HealthResponse(msgspec.Struct):
    status: Literal["ok", "loading", "not ready", "overloaded", "draining", "shutting down"]  # as /health/ready
    models: list[str]
    default_model: str


class ErrorMessage(msgspec.Struct):
    error_type: str
    message: str | None = None


class ValidationIssue(msgspec.Struct):
    type: str
    loc: list[str | int]
    msg: str


class SystemOneError(msgspec.Struct):
    """Jev's error bodies: a plain string, ``{error_type, message}`` or a FastAPI-style list (422)."""

    detail: str | ErrorMessage | list[ValidationIssue]


class UnsupportedError(msgspec.Struct):
    """A valid request that basal does not support yet (422)."""

    error: Literal["unsupported"]
    detail: list[ValidationIssue]


class BasalError(msgspec.Struct):
    """Every refusal of the upstream dialect."""

    error: str


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """`schema` with every ``$ref`` to its ``$defs`` replaced by the definition. A tagged union keeps its
    discriminator's property but not its ``mapping``, whose targets (``#/$defs/...``) are inlined now."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return _inline(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        inlined = {k: _inline(v, defs) for k, v in schema.items() if k != "$defs"}
        if isinstance(inlined.get("discriminator"), dict) and ("anyOf" in inlined or "oneOf" in inlined):
            inlined["discriminator"] = {k: v for k, v in inlined["discriminator"].items() if k != "mapping"}
        return inlined
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


def json_schema(tp: Any) -> dict[str, Any]:
    schema = msgspec.json.schema(tp)
    return _inline(schema, schema.get("$defs", {}))
