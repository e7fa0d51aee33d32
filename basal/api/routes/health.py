"""The probes: `/health/live` (the process serves HTTP), `/health/ready` (a decision request would be served), and
`/health`, the original endpoint, which means ready (same status code) and keeps its body for existing clients.

Ready means "can serve", not "everything is perfect": 503 while the models load (with each model's step), while
draining or shut down, when a model cannot answer (a lane died; on Ray, a model with no running replica), and
when every in-flight place is taken (every decision request would get 529). Live stays 200 through all of these,
so an orchestrator does not restart a process that is loading, draining or busy (docs/operations.md).
"""

from __future__ import annotations

from typing import Literal

import msgspec
from litestar import Request, Response, route
from litestar.handlers import HTTPRouteHandler

from basal.api.context import api_context
from basal.api.errors import OVERLOADED_HEADERS
from basal.api.wire.openapi import documented, json_content
from basal.api.wire.schema_types import HealthResponse
from basal.core.engine.front import EnginesFront

Readiness = Literal["ok", "loading", "not ready", "overloaded", "draining", "shutting down"]
Ready = Literal[Readiness, "degraded"]  # degraded: decisions are served (200), a part beside them is not working


class LiveResponse(msgspec.Struct):
    status: Literal["alive"]


class ReadyResponse(msgspec.Struct):
    status: Ready
    models: dict[str, str]  # each served model: "loaded", or its load step ("waiting", "loading weights", ...)
    inflight: int
    max_inflight: int
    startup: dict[str, dict[str, float]]  # each loaded model's start-up steps, in seconds (this process's own)
    degraded: dict[str, str] | None = None  # only when degraded: what beside the decisions does not work, and why


def readiness(engines: EnginesFront) -> Readiness:
    """Why the server would refuse a decision request now ("ok": it would not)."""
    if engines.closed:
        return "shutting down"
    if engines.draining:
        return "draining"
    if engines.progress:
        return "loading"
    if not engines.ready():
        return "not ready"
    if engines.inflight >= engines.max_inflight:
        return "overloaded"
    return "ok"


def _ready_or_not(tp: type, ready: str, not_ready: str) -> dict:
    """The OpenAPI responses of a readiness probe: 200 with `ready`, 503 with `not_ready`, one body type."""
    return {
        "200": {"description": ready, "content": json_content(tp)},
        "503": {"description": not_ready, "content": json_content(tp)},
    }


def _answer(body: dict, status: str) -> Response:
    ok = status in ("ok", "degraded")
    return Response(body, status_code=200 if ok else 503, headers=None if ok else OVERLOADED_HEADERS)


async def health(request: Request) -> Response:
    engines = api_context(request).engines
    status = readiness(engines)
    return _answer({"status": status, "models": engines.names, "default_model": engines.default}, status)


async def live() -> Response:
    return Response({"status": "alive"})


async def ready(request: Request) -> Response:
    context = api_context(request)
    engines = context.engines
    status: str = readiness(engines)
    degraded = {}
    if context.batches is not None and context.batches.fault.reason is not None:
        degraded["batches"] = f"batch work is paused: {context.batches.fault.reason}"
    if degraded and status == "ok":
        status = "degraded"
    loading = dict(engines.progress)
    models = {name: loading.get(name, "loaded") for name in engines.names}
    body = {
        "status": status,
        "models": models,
        "inflight": engines.inflight,
        "max_inflight": engines.max_inflight,
        "startup": engines.startup,
    }
    if degraded:
        body["degraded"] = degraded
    return _answer(body, status)


def health_routes() -> list[HTTPRouteHandler]:
    return [
        route(
            "/health",
            http_method=["GET", "HEAD"],
            operation_class=documented(
                _ready_or_not(
                    HealthResponse,
                    "ready (as /health/ready)",
                    "loading, overloaded, draining or shut down (retry elsewhere)",
                )
            ),
            summary="Readiness and the served models (the original probe; same status as /health/ready)",
            tags=["service"],
        )(health),
        route(
            "/health/live",
            http_method=["GET", "HEAD"],
            operation_class=documented(
                {"200": {"description": "the process serves HTTP", "content": json_content(LiveResponse)}}
            ),
            summary="Liveness: 200 while the process answers HTTP (also while loading, draining or busy)",
            tags=["service"],
        )(live),
        route(
            "/health/ready",
            http_method=["GET", "HEAD"],
            operation_class=documented(
                _ready_or_not(
                    ReadyResponse,
                    "every model is loaded and a decision request would be served (`degraded`: a part beside"
                    " the decisions, such as batch work, is not working, and why)",
                    "loading (each model's step), overloaded, a model cannot answer, draining",
                )
            ),
            summary="Readiness: 200 when a decision request would be served, 503 (and why) when not",
            tags=["service"],
        )(ready),
    ]
