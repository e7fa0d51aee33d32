"""A decision from a request body, without HTTP: each dialect's parser for the engines behind a front, and what a
batch line runs. The HTTP routes (`routes/decisions.py`) add what a connection needs around it (keys, reading the
body, slots, headers); `basal run-batch` uses it as it is, so it imports no web framework."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from basal.api.errors import error_response, too_large
from basal.api.settings import ApiSettings
from basal.core.engine.front import EnginesFront, ModelInfo
from basal.core.request.dialects import decode_body, parse_basal, parse_systemone
from basal.core.request.model_names import model_resolver
from basal.core.request.plan import DecisionRequest
from basal.observability.logs import REQUEST_ID
from basal.observability.request_context import new_request_id

log = logging.getLogger(__name__)

Parse = Callable[[Any], DecisionRequest]  # a decoded JSON body -> a validated request (or a RequestError)


class ModelFacts:
    """What the parsers ask of the front about a served model (does it serve evidence, its prompt limit), asked
    once per model: on Ray each question is a call to a replica."""

    def __init__(self, engines: EnginesFront):
        self._engines = engines
        self._infos: dict[str, ModelInfo] = {}

    def _info(self, name: str) -> ModelInfo:
        if name not in self._infos:
            self._infos[name] = self._engines.model_info(name)
        return self._infos[name]

    def serves_evidence(self, name: str) -> bool:
        return self._info(name).serves_evidence

    def prompt_bound(self, name: str) -> tuple[int, int] | None:
        """The model's prompt limit, which the parser checks before facts run."""
        return self._info(name).prompt_bound


def parsers(engines: EnginesFront, settings: ApiSettings, model_facts: ModelFacts | None = None) -> dict[str, Parse]:
    """Each dialect's parser for these engines ("systemone", "basal"): served names, the default model, the limits,
    and what each model serves (`model_facts`, asked once per model and shared by both)."""
    resolve = model_resolver(engines.names, engines.default)  # unknown names are told the served ones
    facts = model_facts or ModelFacts(engines)
    options = {"limits": settings.limits, "serves_evidence": facts.serves_evidence, "prompt_bound": facts.prompt_bound}
    return {
        "systemone": lambda raw: parse_systemone(raw, resolve, **options),
        "basal": lambda raw: parse_basal(raw, resolve, **options),
    }


def body_decider(engines: EnginesFront, settings: ApiSettings, parse: Parse | None = None):
    """What a batch line runs: `POST /v1/basal`'s path from a decoded JSON body on, as background work.
    -> async (body bytes, cancelled) -> (status, response body bytes, request id), the body byte for byte what
    the online route answers (its contract checks, the same parser and limits, the same encoder). `parse`: the
    `/v1/basal` parser the app's routes share (one is built when not given)."""
    parse = parse or parsers(engines, settings)["basal"]

    async def decide(body: bytes, cancelled: Callable[[], bool]) -> tuple[int, bytes, str]:
        rid = new_request_id()
        while engines.progress and not engines.closed:  # `basal serve` listens (and resumes batches) before loading
            await asyncio.sleep(0.2)
        token = REQUEST_ID.set(rid)  # the record's request_id is on every log line of its line, lanes' included
        try:
            if len(body) > settings.max_body_bytes:
                raise too_large("Request body too large.", "basal")
            plan = await asyncio.to_thread(lambda: parse(decode_body(body, "basal")))  # off the online requests' loop
            result = await engines.run(plan, cancelled, has_slot=True, background=True)
            return 200, msgspec.json.encode(result.response), rid
        except Exception as exc:
            status, error_body, _ = error_response(exc, "basal")
            log.debug("batch line %s answered %d: %s", rid, status, error_body)
            return status, msgspec.json.encode(error_body), rid
        finally:
            REQUEST_ID.reset(token)

    return decide
