"""The shared path of a decision request in either dialect: slot, auth, body, contract, engine, response headers.

Order (cheapest refusal first): shutdown (503) and a full `max_inflight` (529), both before a byte of the body is
read, so a retry storm costs no parsing; the key (401 / 403), the Content-Type (415), the body (413; its bytes
count against `max_transit_bytes` while it arrives, 529 past it); then an in-flight slot (529 / 503) and the
contract. The slot is taken once the body is in: a slow body holds no decision capacity. Large
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

from basal.api.body import TransitBytes, check_content_type, decompress, read_body
from basal.api.errors import ClientGone, auth_error, error_response
from basal.core.engine.engines import EnginesFront, Result
from basal.core.errors import Cancelled, EngineClosed, Overloaded
from basal.core.request.dialects import decode_body
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
    transit: TransitBytes = field(default_factory=TransitBytes)  # bodies being received (not a setting: a count)


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
    started = time.perf_counter()
    endpoint, metrics, rid = f"/v1/{dialect}", engines.metrics, request_id()
    model, label = "-", ""
    metrics.http_inflight.inc(endpoint)
    watcher = None
    try:
        if engines.closed or engines.draining:  # refused before a byte of the body is read
            raise EngineClosed("the server is shutting down")
        if engines.inflight >= engines.max_inflight:  # a retry storm costs no reading or parsing
            raise Overloaded()
        check_auth(request, settings, dialect)
        body = await _read(request, dialect, settings)
        with engines.slot():
            plan = await _plan(request, body, dialect, settings, parse)
            del body
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
