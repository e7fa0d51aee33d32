"""The shared path of a decision request in either dialect: slot, auth, body, contract, engine, response headers.

Order (cheapest refusal first): shutdown (503) and a full `max_inflight` (529), both before a byte of the body is
read, so a retry storm costs no parsing; the key (401 / 403), the Content-Type (415), the body (413; its bytes
count against `max_transit_bytes` while it arrives, 529 past it); then an in-flight slot (529 / 503) and the
contract. The slot is taken once the body is in: a slow body holds no decision capacity. Large
or compressed bodies are decompressed, decoded and validated in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler

from basal.api.context import ApiContext, api_context
from basal.api.decide import Parse, with_diagnostics
from basal.api.errors import error_response
from basal.api.http.auth import check_auth, request_owner
from basal.api.http.body import check_content_type, decompress, read_body
from basal.api.settings import ApiSettings
from basal.api.wire.openapi import (
    DIAGNOSTICS_PARAMETER,
    REQUEST_EXAMPLES,
    decision_responses,
    documented,
    request_schema,
)
from basal.api.wire.schema_types import BasalRequest, SystemOneRequest
from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.engine.answer_cache import AnswerCache, Stored, model_identity, request_key, split_timing
from basal.core.engine.drift import DriftFront, marks
from basal.core.engine.front import EnginesFront, Result
from basal.core.errors import EngineClosed, Overloaded, native_refusal, systemone_usage
from basal.core.request.dialects import decode_body
from basal.core.request.plan import DecisionRequest
from basal.observability.request_context import current_request_id, note

DIAGNOSTICS_HEADER = "x-basal-diagnostics"
CACHE_HEADER = "x-basal-cache"  # hit | miss | bypass (Cache-Control: no-cache), when the answer cache is on
INLINE_BODY_BYTES = 64 << 10  # identity bodies up to this size are decoded on the event loop (a hop costs more)
MAX_WARNINGS_HEADER = 1024  # characters of x-basal-warnings (the plan lists a few warnings, each one short)

log = logging.getLogger(__name__)


async def _watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    """The ASGI server sends http.disconnect when the client closes the connection."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


def wants_diagnostics(request: Request, dialect: str) -> bool:
    """The opt-in ``x-basal-diagnostics`` header: 1/true asks, 0/false or no header does not; anything else is
    refused, so a typo is not silently an answer without them."""
    value = request.headers.get(DIAGNOSTICS_HEADER)
    if value is None or value.strip().lower() in ("0", "false", ""):
        return False
    if value.strip().lower() in ("1", "true"):
        return True
    message = f"{DIAGNOSTICS_HEADER} must be 1, true, 0 or false (got {value[:40]!r})"
    raise systemone_usage(message) if dialect == "systemone" else native_refusal(message)


def timing_headers(result: Result, rid: str) -> dict[str, str]:
    headers = {
        "x-basal-queue-ms": f"{result.queue_ms:.3f}",
        "x-basal-compute-ms": f"{result.compute_ms:.3f}",
        "x-basal-batch-requests": str(result.pass_requests),
        "x-request-id": rid,
        "x-typesafe-request-id": rid,
    }
    if result.replica:
        headers["x-basal-replica"] = result.replica
    if result.cascade is not None:  # who answered (the TypeSafe answer shape is fixed; /v1/basal also says per answer)
        headers["x-basal-answered-by"] = result.cascade.answered_by_header()
        if failed := result.cascade.failure_header():
            headers["x-basal-escalation-failed"] = failed.encode("ascii", "backslashreplace").decode("ascii")[:1024]
    return headers


def warnings_header(messages: tuple[str, ...]) -> str:
    """The ``x-basal-warnings`` value: the plan's warnings joined, ASCII only (escaped), at most 1 KiB."""
    value = "; ".join(messages).encode("ascii", "backslashreplace").decode("ascii")
    return value if len(value) <= MAX_WARNINGS_HEADER else value[: MAX_WARNINGS_HEADER - 3] + "..."


def refuse_early(engines: EnginesFront) -> None:
    """Refusals before a byte of the body is read: a closing server (503), a full one (529: a retry storm costs no
    reading or parsing)."""
    if engines.closed or engines.draining:
        raise EngineClosed("the server is shutting down")
    if engines.inflight >= engines.max_inflight:
        raise Overloaded()


async def read_decision_body(request: Request, dialect: str, settings: ApiSettings) -> bytes:
    """The body, read before a decision slot is taken (a slow body holds bytes in transit, not a slot)."""
    check_content_type(request.headers, dialect)
    limits = settings.limits
    return await read_body(
        request.receive, request.headers, settings.max_body_bytes, dialect, settings.transit, limits.max_transit_bytes
    )


async def _plan(request: Request, body: bytes, dialect: str, settings: ApiSettings, parse: Parse) -> DecisionRequest:
    """Decompress, decode and validate the body; the CPU-bound part off the loop when the body is large."""
    encoding = request.headers.get("content-encoding")

    def decode() -> Any:
        return decode_body(decompress(body, encoding, settings.max_body_bytes, dialect), dialect)

    def parsed(raw: Any) -> DecisionRequest:
        plan = parse(raw)
        if settings.capture is not None:  # a valid request, as its client sent it
            settings.capture.offer(raw, rid)
        return plan

    rid = current_request_id()
    if len(body) > INLINE_BODY_BYTES or (encoding or "identity").strip().lower() != "identity":
        return await asyncio.to_thread(lambda: parsed(decode()))
    raw = decode()
    if isinstance(raw, dict) and raw.get("facts") == "auto":  # linear in the state, but not free: off the loop
        return await asyncio.to_thread(parsed, raw)
    return parsed(raw)


async def handle_decision(request: Request, dialect: str, context: ApiContext) -> Response:
    """One decision request, start to end; never raises (every failure becomes the dialect's error response)."""
    engines, settings, parse = context.engines, context.settings, context.parsers[dialect]
    started, started_ns = time.perf_counter(), time.time_ns()
    endpoint, metrics, rid = f"/v1/{dialect}", engines.metrics, current_request_id()
    model = "-"
    metrics.http_inflight.inc(endpoint)
    watcher = reuse = stored = None
    try:
        refuse_early(engines)
        check_auth(request, settings, dialect)
        diagnostics = wants_diagnostics(request, dialect)
        body = await read_decision_body(request, dialect, settings)
        with engines.slot():
            plan = await _plan(request, body, dialect, settings, parse)
            if diagnostics:
                plan = replace(plan, diagnostics=True)
            if scope := cache_scope(request, settings):  # the caches' scope: this key's own entries
                plan = replace(plan, cache_scope=scope)
            model = plan.model
            note(model=model)
            parsed_ns = time.time_ns()
            metrics.parse_duration.observe(endpoint, value=(parsed_ns - started_ns) / 1e9)
            reuse = AnswerReuse.of(request, settings, engines, plan, body, dialect)  # the exact-answer cache
            del body
            stored = reuse.lookup() if reuse is not None else None
            if stored is None:
                gone = asyncio.Event()
                watcher = asyncio.create_task(_watch_disconnect(request, gone))
                result = await engines.run(plan, gone.is_set, has_slot=True)
        if stored is not None:  # answered from the cache: only the timings are new
            content = stored.body(msgspec.json.encode(round((time.perf_counter() - started) * 1000, 3)))
            done = Result(None, 0.0, 0.0, 0)  # type: ignore[arg-type]  # nothing queued or computed
            input_tokens = stored.input_tokens
            if isinstance(engines, DriftFront):  # a served answer is in the stream of decisions, cached or not
                engines.recorder.count(model, stored.marks)
        else:
            content = with_diagnostics(msgspec.json.encode(result.response), result.diagnostics)
            done, input_tokens = result, result.response.usage.input_tokens
        status, headers = 200, timing_headers(done, rid)
        if reuse is not None and stored is not None:
            headers[CACHE_HEADER] = "hit"
        elif reuse is not None:  # kept with the marks drift counts its hits by
            drift = marks(plan, result.response.answers) if isinstance(engines, DriftFront) else ()
            headers[CACHE_HEADER] = reuse.store(result, content, drift)
        headers["x-basal-total-ms"] = f"{(time.perf_counter() - started) * 1000:.3f}"
        if plan.warnings:
            headers["x-basal-warnings"] = warnings_header(plan.warnings)
            log.warning("%s answered with warnings: %s", endpoint, headers["x-basal-warnings"])
        note(queue_ms=round(done.queue_ms, 3), compute_ms=round(done.compute_ms, 3))
        metrics.input_tokens.inc(model, by=input_tokens)
        metrics.questions.inc(model, by=len(plan.questions))
        if settings.tracer is not None:
            attributes = {"basal.model": model, "basal.questions": len(plan.questions), "basal.request_id": rid}
            if done.replica:
                attributes["basal.replica"] = done.replica
            settings.tracer.stages(started_ns, parsed_ns, time.time_ns(), done.queue_ms, done.compute_ms, attributes)
    except Exception as exc:
        status, error_body, headers = error_response(exc, dialect)
        content = msgspec.json.encode(error_body)
        headers = {**headers, "x-request-id": rid, "x-typesafe-request-id": rid}
    finally:
        if watcher is not None:
            watcher.cancel()
        metrics.http_inflight.inc(endpoint, by=-1)
    seconds = time.perf_counter() - started
    metrics.http_requests.inc(endpoint, model, str(status))  # 499: the client hung up (docs/http-api.md §8)
    metrics.http_duration.observe(endpoint, model, str(status), value=seconds)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


async def systemone(request: Request) -> Response[SystemOneResponse]:
    return await handle_decision(request, "systemone", api_context(request))


async def basal(request: Request) -> Response[BasalResponse]:
    return await handle_decision(request, "basal", api_context(request))


def decision_routes(settings: ApiSettings) -> list[HTTPRouteHandler]:
    """Both dialects' routes, documented with the statuses they send, the limits in force and the key scheme."""
    keys, limits = bool(settings.api_keys), settings.limits
    return [
        post(
            "/v1/systemone",
            operation_class=documented(
                decision_responses("systemone", SystemOneResponse, keys),
                request_schema(SystemOneRequest, limits),
                keys,
                REQUEST_EXAMPLES["systemone"],
                [DIAGNOSTICS_PARAMETER],
            ),
            status_code=200,
            summary="TypeSafe System One decisions",
            tags=["decisions"],
        )(systemone),
        post(
            "/v1/basal",
            operation_class=documented(
                decision_responses("basal", BasalResponse, keys),
                request_schema(BasalRequest, limits),
                keys,
                REQUEST_EXAMPLES["basal"],
                [DIAGNOSTICS_PARAMETER],
            ),
            status_code=200,
            summary="Decisions in the upstream basal-serve dialect",
            tags=["decisions"],
        )(basal),
    ]


def cache_scope(request: Request, settings: ApiSettings) -> str:
    """Whose cached answers and states a request may read: with API keys (unless `caches_shared`) its key's
    digest, the owner of what it creates (`auth.request_owner`); else "" (one scope). A hit is faster than a miss,
    so a scope shared between keys lets one client time another's requests (docs/caches.md)."""
    return settings.cache_scope(request_owner(request, settings))


class AnswerReuse:
    """The exact-answer cache's view of one request (`basal.core.engine.answer_cache`): its key, whether the client
    bypasses the cache (`Cache-Control: no-cache`; `no-store`: nothing is kept either), and storing its answer."""

    def __init__(self, cache: AnswerCache, key: bytes, lookup: bool, keep: bool) -> None:
        self.cache, self.key, self._lookup, self._keep = cache, key, lookup, keep

    @classmethod
    def of(
        cls, request: Request, settings: ApiSettings, engines: EnginesFront, plan: DecisionRequest, body: bytes,
        dialect: str,
    ) -> AnswerReuse | None:  # fmt: skip
        cache = settings.answer_cache
        if cache is None:
            return None
        directives = {d.strip().lower() for d in request.headers.get("cache-control", "").split(",")}
        scope = plan.cache_scope or "shared"
        identity = cache.identities.get(plan.model)
        if identity is None:  # asked once per model (on Ray a call to a replica); a reloaded calibration clears it
            info = engines.model_info(plan.model)
            identity = cache.identities[plan.model] = model_identity(
                info.name, info.version, info.calibration, info.compute
            )
        encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
        key = request_key(dialect, scope, identity, plan.diagnostics, encoding, body)
        return cls(cache, key, "no-cache" not in directives, "no-store" not in directives)

    def lookup(self) -> Stored | None:
        if not self._lookup:
            self.cache.bypass()
            return None
        return self.cache.get(self.key)

    def store(self, result: Result, content: bytes, drift: tuple[tuple[str, str, float], ...] = ()) -> str:
        """Keep a computed answer (with its drift marks) -> the response's cache header ("miss", or "bypass" under
        no-cache)."""
        if self._keep:
            encoded = msgspec.json.encode(result.response)  # `content` is these bytes, diagnostics spliced in
            head, tail, timed = split_timing(encoded)
            extra = content[len(encoded) - 1 :] if len(content) > len(encoded) else b""
            tokens = result.response.usage.input_tokens
            stored = Stored(head, tail[:-1] if extra else tail, extra, timed, tokens, drift)
            self.cache.put(self.key, stored)
        return "miss" if self._lookup else "bypass"
