"""`POST /v1/decisions`: OpenAI's Decisions API in the shape vLLM serves it (`api/wire/decisions_types.py`).

A request is translated into a `/v1/basal` body (a predicate is a noul question, a choice's values its criteria, a
score's levels its criteria in order) and runs through that dialect's parser and the same engines, so its answers
are the same bits as `/v1/basal`'s for the same questions; the answers are translated back in question order.
Every refusal is vLLM's `{"error": {message, type, param, code}}`: a body that does not validate, or that basal
refuses (its limits, an option it cannot ask), is a 400; an unknown model a 404.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler

from basal.api.context import api_context
from basal.api.errors import error_response
from basal.api.http.auth import check_auth
from basal.api.http.body import decompress
from basal.api.routes.decisions import INLINE_BODY_BYTES, cache_scope, read_decision_body, refuse_early
from basal.api.settings import ApiSettings
from basal.api.wire.decisions_types import (
    ChoiceAnswer,
    ChoiceProbability,
    ChoiceQuestion,
    DecisionsError,
    DecisionsErrorInfo,
    DecisionsRequest,
    DecisionsResponse,
    DecisionsUsage,
    InputTokensDetails,
    OutputTokensDetails,
    PredicateAnswer,
    PredicateQuestion,
    ScoreAnswer,
    ScoreProbability,
    ScoreQuestion,
)
from basal.api.wire.openapi import documented, json_content
from basal.core.decision.answers import BasalResponse
from basal.core.errors import RequestError
from basal.core.request.limits import echo
from basal.core.request.model_names import model_resolver
from basal.observability.request_context import current_request_id, note

ENDPOINT = "/v1/decisions"
DIALECT = "basal"  # the dialect whose parser, limits and refusals the translated body meets
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    413: "RequestEntityTooLargeError",
    415: "UnsupportedMediaTypeError",
    503: "ServiceUnavailableError",
    529: "OverloadedError",
}


def refusal(status: int, message: str) -> RequestError:
    return RequestError(
        status, DecisionsError(DecisionsErrorInfo(message, ERROR_TYPES.get(status, "Error"), None, status))
    )


def input_text(value: str | list) -> str:
    """The state text: messages apart by a blank line, a message's text parts by a newline (as vLLM joins them)."""
    if isinstance(value, str):
        return value
    return "\n\n".join(m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content) for m in value)


def _option_text(value: str | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _distinct(shown: str, texts: list[str], what: str) -> None:
    """Options are keyed by their text in the basal body: two that read the same would be one option."""
    if len(set(texts)) != len(texts):
        raise refusal(400, f'{shown}: {what} must be distinct (a value and its text, e.g. true and "true", are one)')


def basal_question(i: int, q: PredicateQuestion | ChoiceQuestion | ScoreQuestion) -> dict[str, Any]:
    """Question `i` as a `/v1/basal` question."""
    shown = f"questions[{i}]"
    if isinstance(q, PredicateQuestion):
        return {"type": "noul", "instructions": q.instructions}
    if isinstance(q, ChoiceQuestion):
        texts = [_option_text(c.value) for c in q.choices]
        _distinct(shown, texts, "choice values")
        criteria = {t: (c.description or None) for t, c in zip(texts, q.choices, strict=True)}
        return {"type": "choice", "instructions": q.instructions, "criteria": criteria}
    if any(level.description for level in q.levels):
        _distinct(shown, [level.label for level in q.levels], "score labels with descriptions")
        levels: Any = {level.label: level.description or None for level in q.levels}
    else:
        levels = [level.label for level in q.levels]
    return {"type": "score", "instructions": q.instructions, "criteria": levels}


def basal_body(request: DecisionsRequest, model: str) -> dict[str, Any]:
    """The `/v1/basal` body of a Decisions request; each question named by its place (`questions[0]`, ...), as a
    refusal names it to the client."""
    questions = {f"questions[{i}]": basal_question(i, q) for i, q in enumerate(request.questions)}
    return {"model": model, "state": input_text(request.input), "questions": questions}


def decisions_answer(q: PredicateQuestion | ChoiceQuestion | ScoreQuestion, answer: Any):
    """A `/v1/basal` answer as the Decisions answer to `q`, its probabilities in the question's option order."""
    name = None if q.name is msgspec.UNSET else q.name
    if isinstance(q, PredicateQuestion):
        return PredicateAnswer(name, answer.noul)
    if isinstance(q, ChoiceQuestion):
        texts = [_option_text(c.value) for c in q.choices]
        shown = [ChoiceProbability(c.value, answer.probabilities[t]) for c, t in zip(q.choices, texts, strict=True)]
        return ChoiceAnswer(name, q.choices[texts.index(answer.choice)].value, shown, answer.confidence)
    keys = list(answer.probabilities)  # the levels' own keys (labels, or their positions), in level order
    probabilities = [answer.probabilities[k] for k in keys]
    levels = [
        ScoreProbability(i, level.label, p) for i, (level, p) in enumerate(zip(q.levels, probabilities, strict=True))
    ]
    return ScoreAnswer(name, sum(i * p for i, p in enumerate(probabilities)), levels, max(probabilities))


def decisions_response(request: DecisionsRequest, response: BasalResponse) -> DecisionsResponse:
    answers = [decisions_answer(q, response.answers[f"questions[{i}]"]) for i, q in enumerate(request.questions)]
    usage = response.usage
    cached = 0 if usage.cached_tokens is msgspec.UNSET else usage.cached_tokens
    tokens = DecisionsUsage(
        usage.input_tokens,
        InputTokensDetails(cached_tokens=cached),
        usage.output_tokens,
        OutputTokensDetails(),
        usage.input_tokens + usage.output_tokens,
    )
    return DecisionsResponse(response.model, answers, tokens)


def as_decisions_error(status: int, body: Any) -> tuple[int, DecisionsError]:
    """Any refusal on the way (the basal dialect's, auth, limits) in vLLM's envelope; a body basal refuses is
    a 400, as vLLM answers a request it cannot serve."""
    if isinstance(body, DecisionsError):
        return status, body
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    elif isinstance(body, dict) and isinstance(body.get("detail"), dict):
        message = str(body["detail"].get("message", body["detail"]))
    else:
        message = str(body.get("detail", body) if isinstance(body, dict) else body)
    status = 400 if status == 422 else status
    return status, DecisionsError(DecisionsErrorInfo(message, ERROR_TYPES.get(status, "Error"), None, status))


def parse_request(body: bytes) -> DecisionsRequest:
    try:
        return msgspec.json.decode(body, type=DecisionsRequest)
    except msgspec.ValidationError as e:
        raise refusal(400, str(e)) from None
    except msgspec.DecodeError as e:
        raise refusal(400, f"the body is not JSON ({e})") from None


async def decisions(request: Request) -> Response[DecisionsResponse]:
    context = api_context(request)
    engines, settings = context.engines, context.settings
    started, rid, model = time.perf_counter(), current_request_id(), "-"
    engines.metrics.http_inflight.inc(ENDPOINT)
    try:
        refuse_early(engines)
        check_auth(request, settings, DIALECT)
        body = await read_decision_body(request, DIALECT, settings)
        with engines.slot():
            encoding = request.headers.get("content-encoding")
            wire = parse_request(decompress(body, encoding, settings.max_body_bytes, DIALECT))
            model = model_resolver(engines.names, engines.default)(wire.model) or "-"
            if model == "-":
                raise refusal(404, f"The model `{echo(wire.model, settings.limits)}` does not exist.")
            note(model=model)
            translated = basal_body(wire, model)
            parse = context.parsers[DIALECT]
            plan = await asyncio.to_thread(parse, translated) if len(body) > INLINE_BODY_BYTES else parse(translated)
            if scope := cache_scope(request, settings):
                plan = replace(plan, cache_scope=scope)
            result = await engines.run(plan, lambda: False, has_slot=True)
        status, content, headers = 200, decisions_response(wire, result.response), {"x-request-id": rid}
        engines.metrics.input_tokens.inc(model, by=result.response.usage.input_tokens)
        engines.metrics.questions.inc(model, by=len(plan.questions))
    except Exception as exc:
        status, error_body, headers = error_response(exc, DIALECT)
        status, content = as_decisions_error(status, error_body)
        headers = {**headers, "x-request-id": rid}
    finally:
        engines.metrics.http_inflight.inc(ENDPOINT, by=-1)
    engines.metrics.http_requests.inc(ENDPOINT, model, str(status))
    engines.metrics.http_duration.observe(ENDPOINT, model, str(status), value=time.perf_counter() - started)
    return Response(msgspec.json.encode(content), status_code=status, media_type="application/json", headers=headers)


EXAMPLES = {
    "decisions-md": {
        "summary": "vLLM's decisions.md example (model: any served name, or jev-latest for the default)",
        "value": {
            "model": "jev-latest",
            "input": "The package arrived with a broken screen.",
            "questions": [
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
            ],
        },
    }
}
ERROR_STATUSES = {
    "400": "the body does not validate, or asks what basal cannot (its limits, an option it cannot ask)",
    "404": "no served model has that name",
    "413": "the body (or its decompressed form) is over the size limit",
    "415": "Content-Type is not application/json, or Content-Encoding is unknown",
    "503": "the server is shutting down",
    "529": "too many requests in flight",
}


def openai_decisions_routes(settings: ApiSettings) -> list[HTTPRouteHandler]:
    keys = bool(settings.api_keys)
    error = json_content(DecisionsError)
    responses: dict[str, Any] = {
        "200": {"description": "the answers, in question order", "content": json_content(DecisionsResponse)}
    }
    statuses = ERROR_STATUSES | ({"401": "wrong API key", "403": "no API key"} if keys else {})
    responses |= {code: {"description": text, "content": error} for code, text in statuses.items()}
    return [
        post(
            ENDPOINT,
            operation_class=documented(
                dict(sorted(responses.items())),
                json_content(DecisionsRequest)["application/json"]["schema"],
                keys,
                EXAMPLES,
            ),
            status_code=200,
            summary="OpenAI's Decisions API, as vLLM serves it",
            tags=["decisions"],
        )(decisions)
    ]
