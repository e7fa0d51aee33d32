"""A decision from a request body, without HTTP: each dialect's parser for the engines behind a front, and what a
batch line runs. The HTTP routes (`routes/decisions.py`) add what a connection needs around it (keys, reading the
body, slots, headers); `basal run-batch` uses it as it is, so it imports no web framework."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgspec

from basal.api.errors import error_response, too_large
from basal.api.settings import ApiSettings
from basal.core.decision.diagnostics import Diagnostics
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


def with_diagnostics(content: bytes, diagnostics: Diagnostics | None) -> bytes:
    """The response's JSON object with a last member ``"diagnostics"``; without diagnostics the bytes unchanged.
    Spliced after encoding, so the answer's own bytes are exactly those of a request that did not ask."""
    if diagnostics is None:
        return content
    return content[:-1] + b',"diagnostics":' + msgspec.json.encode(diagnostics) + b"}"


def body_decider(
    engines: EnginesFront,
    settings: ApiSettings,
    parse: Parse | None = None,
    dialect: str = "basal",
    diagnostics: bool = False,
    owner: str | None = None,
    letter_mass: bool = True,
):
    """What a batch line runs: `POST /v1/basal`'s path from a decoded JSON body on, as background work.
    -> async (body bytes, cancelled) -> (status, response body bytes, request id), the body byte for byte what
    the online route answers (its contract checks, the same parser and limits, the same encoder). `parse`: the
    dialect's parser the app's routes share (one is built when not given). `dialect` "systemone" runs
    `POST /v1/systemone`'s path instead; `diagnostics` answers as with `x-basal-diagnostics: 1` (`basal calibrate`
    reads the orders' average from them); `letter_mass` False leaves the diagnostics' letter mass out (null), so the
    lines run the online forward path with no product with the whole LM head. `owner`: the key whose work the
    lines are (a batch's owner): they read and fill that key's state cache entries, as its online requests do
    (`ApiSettings.cache_scope`)."""
    parse = parse or parsers(engines, settings)[dialect]
    scope = settings.cache_scope(owner)

    async def decide(body: bytes, cancelled: Callable[[], bool]) -> tuple[int, bytes, str]:
        rid = new_request_id()
        while engines.progress and not engines.closed:  # `basal serve` listens (and resumes batches) before loading
            await asyncio.sleep(0.2)
        token = REQUEST_ID.set(rid)  # the record's request_id is on every log line of its line, lanes' included
        try:
            if len(body) > settings.max_body_bytes:
                raise too_large("Request body too large.", dialect)
            plan = await asyncio.to_thread(lambda: parse(decode_body(body, dialect)))  # off the online requests' loop
            if diagnostics:
                plan = replace(plan, diagnostics=True, letter_mass=letter_mass)
            if scope:
                plan = replace(plan, cache_scope=scope)
            result = await engines.run(plan, cancelled, has_slot=True, background=True)
            return 200, with_diagnostics(msgspec.json.encode(result.response), result.diagnostics), rid
        except Exception as exc:
            status, error_body, _ = error_response(exc, dialect)
            log.debug("batch line %s answered %d: %s", rid, status, error_body)
            return status, msgspec.json.encode(error_body), rid
        finally:
            REQUEST_ID.reset(token)

    return decide
