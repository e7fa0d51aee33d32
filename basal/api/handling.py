"""The shared path of a decision request in either dialect: auth, body, contract, engine, response headers."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Response

from basal.api.body import decompress
from basal.api.errors import auth_error, error_response
from basal.core.contract import DecisionRequest, decode_body
from basal.core.engine import Cancelled, Engines, Result


@dataclass
class ApiSettings:
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 16 << 20
    release_date: str = "2026-10-05"
    metrics: bool = False
    descriptions: dict[str, str] = field(default_factory=dict)


def request_id() -> str:
    return f"req_{secrets.token_hex(16)}"


def check_auth(request: Request, settings: ApiSettings, dialect: str) -> None:
    if not settings.api_keys:
        return
    header = request.headers.get("authorization")
    if not header:
        raise auth_error(missing=True, dialect=dialect)
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not any(hmac.compare_digest(key.strip(), k) for k in settings.api_keys):
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


async def decide(
    request: Request,
    dialect: str,
    engines: Engines,
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
        check_auth(request, settings, dialect)
        body = decompress(await request.body(), request.headers.get("content-encoding"), settings.max_body_bytes)
        raw = decode_body(body, dialect)
        if isinstance(raw, dict) and raw.get("facts") == "auto":  # linear in the state, but not free: off the loop
            plan = await asyncio.get_running_loop().run_in_executor(None, parse, raw)
        else:
            plan = parse(raw)
        model = plan.model
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(request, gone))
        result = await engines.run(plan, gone.is_set)
        status, content, headers = 200, msgspec.json.encode(result.response), timing_headers(result, rid)
        headers["x-basal-total-ms"] = f"{(time.perf_counter() - started) * 1000:.3f}"
        metrics.input_tokens.inc(model, by=result.response.usage.input_tokens)
        metrics.questions.inc(model, by=len(plan.questions))
    except Exception as exc:
        status, error_body, headers = error_response(exc, dialect)
        content = msgspec.json.encode(error_body)
        headers = {**headers, "x-request-id": rid, "x-typesafe-request-id": rid}
        label = "cancelled" if isinstance(exc, Cancelled) else ""
    finally:
        if watcher is not None:
            watcher.cancel()
        metrics.http_inflight.inc(endpoint, by=-1)
    label = label or str(status)
    metrics.http_requests.inc(endpoint, model, label)
    metrics.http_duration.observe(endpoint, model, label, value=time.perf_counter() - started)
    return Response(content, status_code=status, media_type="application/json", headers=headers)
