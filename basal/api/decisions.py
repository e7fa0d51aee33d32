"""The shared path of a decision request in either dialect: slot, auth, body, contract, engine, response headers.

Order (cheapest refusal first): shutdown (503) and a full `max_inflight` (529), both before a byte of the body is
read, so a retry storm costs no parsing; the key (401 / 403), the Content-Type (415), the body (413; its bytes
count against `max_transit_bytes` while it arrives, 529 past it); then an in-flight slot (529 / 503) and the
contract. The slot is taken once the body is in: a slow body holds no decision capacity. Large
or compressed bodies are decompressed, decoded and validated in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
from litestar import Request, Response

from basal.api.body import TransitBytes, check_content_type, decompress, read_body
from basal.api.errors import auth_error, error_response, too_large
from basal.api.observe import current_request_id, new_request_id, note
from basal.api.tracing import Tracer
from basal.core.decision.diagnostics import Diagnostics
from basal.core.engine.answer_cache import AnswerCache, Stored, model_identity, request_key, split_timing
from basal.core.engine.engines import EnginesFront, ModelInfo, Result
from basal.core.engine.pipeline import model_resolver
from basal.core.errors import EngineClosed, Overloaded, native_refusal, systemone_usage
from basal.core.request.dialects import decode_body, parse_basal
from basal.core.request.limits import DEFAULT_LIMITS, Limits
from basal.core.request.plan import DecisionRequest
from basal.logs import REQUEST_ID

DIAGNOSTICS_HEADER = "x-basal-diagnostics"
CACHE_HEADER = "x-basal-cache"  # hit | miss | bypass (Cache-Control: no-cache), when the answer cache is on
INLINE_BODY_BYTES = 64 << 10  # identity bodies up to this size are decoded on the event loop (a hop costs more)
MAX_WARNINGS_HEADER = 1024  # characters of x-basal-warnings (the plan lists a few warnings, each one short)

log = logging.getLogger(__name__)


@dataclass
class ApiSettings:
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 16 << 20
    release_date: str = "2026-10-05"
    metrics: bool = False
    descriptions: dict[str, str] = field(default_factory=dict)
    limits: Limits = DEFAULT_LIMITS
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (none: CORS off)
    public_metrics_and_schema: bool = False  # /metrics and /schema without a key even when keys are set
    access_log: bool = False  # one line per request (basal.access), in the process's log format
    tracer: Tracer | None = None  # OpenTelemetry spans (the otel extra; None: off)
    transit: TransitBytes = field(default_factory=TransitBytes)  # bodies being received (not a setting: a count)
    answer_cache: AnswerCache | None = None  # the exact-answer cache (None: off)
    caches_shared: bool = False  # with api_keys: both caches shared by every key (else one scope per key)


def check_auth(request: Request, settings: ApiSettings, dialect: str) -> None:
    """Bearer key, compared in constant time on bytes: any header bytes (also >= 0x80) get 401, never a 500."""
    verdict = key_verdict(request.headers.get("authorization"), settings.api_keys)
    if verdict is not None:
        raise auth_error(missing=verdict == "missing", dialect=dialect)


def key_verdict(header: str | None, keys: tuple[str, ...]) -> str | None:
    """None when the request may pass (no keys configured, or a matching bearer key); else "missing" or "wrong"."""
    if not keys:
        return None
    if not header:
        return "missing"
    raw = header.encode("latin-1", errors="replace")  # ASGI header bytes, as Litestar decoded them
    scheme, _, key = raw.partition(b" ")
    key = key.strip()
    matched = False
    for k in keys:  # every key is compared, so timing does not tell which one is close
        matched |= hmac.compare_digest(key, k.encode("utf-8"))
    return None if scheme.lower() == b"bearer" and matched else "wrong"


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


def with_diagnostics(content: bytes, diagnostics: Diagnostics | None) -> bytes:
    """The response's JSON object with a last member ``"diagnostics"``; without diagnostics the bytes unchanged.
    Spliced after encoding, so the answer's own bytes are exactly those of a request that did not ask."""
    if diagnostics is None:
        return content
    return content[:-1] + b',"diagnostics":' + msgspec.json.encode(diagnostics) + b"}"


def timing_headers(result: Result, rid: str) -> dict[str, str]:
    headers = {
        "x-basal-queue-ms": f"{result.queue_ms:.3f}",
        "x-basal-compute-ms": f"{result.compute_ms:.3f}",
        "x-basal-batch-requests": str(result.batch_requests),
        "x-request-id": rid,
        "x-typesafe-request-id": rid,
    }
    if result.replica:
        headers["x-basal-replica"] = result.replica
    return headers


def warnings_header(messages: tuple[str, ...]) -> str:
    """The ``x-basal-warnings`` value: the plan's warnings joined, ASCII only (escaped), at most 1 KiB."""
    value = "; ".join(messages).encode("ascii", "backslashreplace").decode("ascii")
    return value if len(value) <= MAX_WARNINGS_HEADER else value[: MAX_WARNINGS_HEADER - 3] + "..."


async def _read(request: Request, dialect: str, settings: ApiSettings) -> bytes:
    """The body, read before a decision slot is taken (a slow body holds bytes in transit, not a slot)."""
    check_content_type(request.headers, dialect)
    limits = settings.limits
    return await read_body(
        request.receive, request.headers, settings.max_body_bytes, dialect, settings.transit, limits.max_transit_bytes
    )


async def _plan(
    request: Request, body: bytes, dialect: str, settings: ApiSettings, parse: Callable[[Any], DecisionRequest]
) -> DecisionRequest:
    """Decompress, decode and validate the body; the CPU-bound part off the loop when the body is large."""
    encoding = request.headers.get("content-encoding")

    def decode() -> Any:
        return decode_body(decompress(body, encoding, settings.max_body_bytes, dialect), dialect)

    if len(body) > INLINE_BODY_BYTES or (encoding or "identity").strip().lower() != "identity":
        return await asyncio.to_thread(lambda: parse(decode()))
    raw = decode()
    if isinstance(raw, dict) and raw.get("facts") == "auto":  # linear in the state, but not free: off the loop
        return await asyncio.to_thread(parse, raw)
    return parse(raw)


async def handle_decision(
    request: Request,
    dialect: str,
    engines: EnginesFront,
    settings: ApiSettings,
    parse: Callable[[Any], DecisionRequest],
) -> Response:
    """One decision request, start to end; never raises (every failure becomes the dialect's error response)."""
    started, started_ns = time.perf_counter(), time.time_ns()
    endpoint, metrics, rid = f"/v1/{dialect}", engines.metrics, current_request_id()
    model = "-"
    metrics.http_inflight.inc(endpoint)
    watcher = reuse = stored = None
    try:
        if engines.closed or engines.draining:  # refused before a byte of the body is read
            raise EngineClosed("the server is shutting down")
        if engines.inflight >= engines.max_inflight:  # a retry storm costs no reading or parsing
            raise Overloaded()
        check_auth(request, settings, dialect)
        diagnostics = wants_diagnostics(request, dialect)
        body = await _read(request, dialect, settings)
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
        else:
            content = with_diagnostics(msgspec.json.encode(result.response), result.diagnostics)
            done, input_tokens = result, result.response.usage.input_tokens
        status, headers = 200, timing_headers(done, rid)
        if reuse is not None:
            headers[CACHE_HEADER] = "hit" if stored is not None else reuse.store(result, content)
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


def cache_scope(request: Request, settings: ApiSettings) -> str:
    """Whose cached answers and states a request may read: with API keys (unless `caches_shared`) a digest of its
    key, which passed `check_auth`; else "" (one scope). A hit is faster than a miss, so a scope shared between
    keys lets one client time another's requests (docs/caches.md)."""
    if not settings.api_keys or settings.caches_shared:
        return ""
    token = request.headers.get("authorization", "").partition(" ")[2].strip()
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


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
        if identity is None:  # asked once per model (on Ray a call to a replica)
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

    def store(self, result: Result, content: bytes) -> str:
        """Keep a computed answer -> the response's cache header ("miss", or "bypass" under no-cache)."""
        if self._keep:
            encoded = msgspec.json.encode(result.response)  # `content` is these bytes, diagnostics spliced in
            head, tail, timed = split_timing(encoded)
            extra = content[len(encoded) - 1 :] if len(content) > len(encoded) else b""
            stored = Stored(head, tail[:-1] if extra else tail, extra, timed, result.response.usage.input_tokens)
            self.cache.put(self.key, stored)
        return "miss" if self._lookup else "bypass"


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


def basal_parser(
    engines: EnginesFront, settings: ApiSettings, model_facts: ModelFacts | None = None
) -> Callable[[Any], DecisionRequest]:
    """The `/v1/basal` dialect's parser for these engines: served names, the default model, the limits, and
    what each model serves (`model_facts`, shared with the app's other routes when given)."""
    resolve = model_resolver(engines.names, engines.default)
    model_facts = model_facts or ModelFacts(engines)
    return lambda raw: parse_basal(
        raw,
        resolve,
        limits=settings.limits,
        serves_evidence=model_facts.serves_evidence,
        prompt_bound=model_facts.prompt_bound,
    )


def body_decider(engines: EnginesFront, settings: ApiSettings):
    """What a batch line runs: `POST /v1/basal`'s path from a decoded JSON body on, as background work.
    -> async (body bytes, cancelled) -> (status, response body bytes, request id), the body byte for byte what
    the online route answers (its contract checks, the same parser and limits, the same encoder)."""
    parse = basal_parser(engines, settings)

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
