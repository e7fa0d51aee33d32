"""The shared path of a decision request in either dialect: slot, auth, body, contract, engine, response headers.

Order (cheapest refusal first): an in-flight slot (529 / 503 before a byte of the body is read, so a retry
storm costs no parsing), the key (401 / 403), the Content-Type (415), the body (413), then the contract. Large
or compressed bodies are decompressed, decoded and validated in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Response

from basal.api.body import check_content_type, decompress, read_body
from basal.api.errors import ClientGone, auth_error, error_response, too_large
from basal.core.engine.engines import EnginesFront, Result
from basal.core.engine.pipeline import model_resolver
from basal.core.errors import Cancelled
from basal.core.request.dialects import decode_body, parse_basal
from basal.core.request.limits import DEFAULT_LIMITS, Limits
from basal.core.request.plan import DecisionRequest

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


def request_id() -> str:
    return f"req_{secrets.token_hex(16)}"


def check_auth(request: Request, settings: ApiSettings, dialect: str) -> None:
    """Bearer key, compared in constant time on bytes: any header bytes (also >= 0x80) get 401, never a 500."""
    if not settings.api_keys:
        return
    header = request.headers.get("authorization")
    if not header:
        raise auth_error(missing=True, dialect=dialect)
    raw = header.encode("latin-1", errors="replace")  # ASGI header bytes, as Litestar decoded them
    scheme, _, key = raw.partition(b" ")
    key = key.strip()
    matched = False
    for k in settings.api_keys:  # every key is compared, so timing does not tell which one is close
        matched |= hmac.compare_digest(key, k.encode("utf-8"))
    if scheme.lower() != b"bearer" or not matched:
        raise auth_error(missing=False, dialect=dialect)


async def _watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    """The ASGI server sends http.disconnect when the client closes the connection."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


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


async def _plan(
    request: Request, dialect: str, settings: ApiSettings, parse: Callable[[Any], DecisionRequest]
) -> DecisionRequest:
    """Read, decompress, decode and validate the body; the CPU-bound part off the loop when the body is large."""
    check_content_type(request.headers, dialect)
    body = await read_body(request.receive, request.headers, settings.max_body_bytes, dialect)
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
    started = time.perf_counter()
    endpoint, metrics, rid = f"/v1/{dialect}", engines.metrics, request_id()
    model, label = "-", ""
    metrics.http_inflight.inc(endpoint)
    watcher = None
    try:
        with engines.slot():
            check_auth(request, settings, dialect)
            plan = await _plan(request, dialect, settings, parse)
            model = plan.model
            gone = asyncio.Event()
            watcher = asyncio.create_task(_watch_disconnect(request, gone))
            result = await engines.run(plan, gone.is_set, has_slot=True)
        status, content, headers = 200, msgspec.json.encode(result.response), timing_headers(result, rid)
        headers["x-basal-total-ms"] = f"{(time.perf_counter() - started) * 1000:.3f}"
        if plan.warnings:
            headers["x-basal-warnings"] = warnings_header(plan.warnings)
            log.warning("%s %s answered with warnings: %s", endpoint, rid, headers["x-basal-warnings"])
        metrics.input_tokens.inc(model, by=result.response.usage.input_tokens)
        metrics.questions.inc(model, by=len(plan.questions))
    except Exception as exc:
        status, error_body, headers = error_response(exc, dialect)
        content = msgspec.json.encode(error_body)
        headers = {**headers, "x-request-id": rid, "x-typesafe-request-id": rid}
        label = "cancelled" if isinstance(exc, Cancelled) else "disconnected" if isinstance(exc, ClientGone) else ""
    finally:
        if watcher is not None:
            watcher.cancel()
        metrics.http_inflight.inc(endpoint, by=-1)
    label = label or str(status)
    metrics.http_requests.inc(endpoint, model, label)
    metrics.http_duration.observe(endpoint, model, label, value=time.perf_counter() - started)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def basal_parser(engines: EnginesFront, settings: ApiSettings) -> Callable[[Any], DecisionRequest]:
    """The `/v1/basal` dialect's parser for these engines: served names, the default model, the limits, and
    which models serve evidence (asked of the front once per model)."""
    resolve = model_resolver(engines.names, engines.default)
    evidence: dict[str, bool] = {}

    def serves_evidence(name: str) -> bool:
        if name not in evidence:
            evidence[name] = engines.model_info(name).serves_evidence
        return evidence[name]

    return lambda raw: parse_basal(raw, resolve, limits=settings.limits, serves_evidence=serves_evidence)


def body_decider(engines: EnginesFront, settings: ApiSettings):
    """What a batch line runs: `POST /v1/basal`'s path from a decoded JSON body on, as background work.
    -> async (body bytes, cancelled) -> (status, response body bytes, request id), the body byte for byte what
    the online route answers (its contract checks, the same parser and limits, the same encoder)."""
    parse = basal_parser(engines, settings)

    async def decide(body: bytes, cancelled: Callable[[], bool]) -> tuple[int, bytes, str]:
        rid = request_id()
        try:
            if len(body) > settings.max_body_bytes:
                raise too_large("Request body too large.", "basal")
            plan = await asyncio.to_thread(lambda: parse(decode_body(body, "basal")))  # off the online requests' loop
            result = await engines.run(plan, cancelled, has_slot=True, background=True)
            return 200, msgspec.json.encode(result.response), rid
        except Exception as exc:
            status, error_body, _ = error_response(exc, "basal")
            return status, msgspec.json.encode(error_body), rid

    return decide
