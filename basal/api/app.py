"""The Litestar application: routes of both dialects, models, health, metrics, and error mapping.

`create_app(engines, settings)` builds the app around engines that are already loaded, so tests can serve the
demo model in-process and `basal serve` can load real models first, with progress, before it listens.
"""

from __future__ import annotations

import logging

import anyio
from litestar import Litestar, Request, Response, Router, post, route
from litestar.config.cors import CORSConfig
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException, PermissionDeniedException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from basal import __version__
from basal.api.batches import batch_routes
from basal.api.capabilities import capabilities
from basal.api.decisions import (
    ApiSettings,
    ModelFacts,
    basal_parser,
    body_decider,
    check_auth,
    handle_decision,
    key_verdict,
)
from basal.api.errors import AUTH_MISSING, AUTH_WRONG, OVERLOADED_HEADERS, litestar_http_exception, unhandled_exception
from basal.api.health import health_routes
from basal.api.observe import RequestContext
from basal.api.openapi import (
    BEARER,
    DIAGNOSTICS_PARAMETER,
    REQUEST_EXAMPLES,
    decision_responses,
    documented,
    request_schema,
)
from basal.api.playground import playground_routes
from basal.api.schema_pages import SCHEMA_PATH, schema_pages
from basal.api.schema_types import (
    BasalRequest,
    ModelsResponse,
    SystemOneError,
    SystemOneRequest,
    json_schema,
)
from basal.api.shadow import shadow_routes
from basal.batch.service import BatchService
from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.engine.engines import EnginesFront
from basal.core.engine.pipeline import model_resolver
from basal.core.engine.shadow import ShadowFront
from basal.core.errors import RequestError
from basal.core.request.dialects import parse_systemone

log = logging.getLogger(__name__)

DESCRIPTION = "basal typed-decision model (choice / noul / score / act / multi), Polish and English"
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_OFF = "Metrics are off: start the server with basal serve --metrics (YAML: metrics: true)."


def create_app(
    engines: EnginesFront,
    settings: ApiSettings | None = None,
    on_shutdown=(),
    batches: BatchService | None = None,
    shadow: ShadowFront | None = None,
) -> Litestar:
    """`batches`: serve the Files and Batches API (docs/batches.md) from this service's store. `shadow`: the
    front that shadows models (`engines` or a front inside it), whose summary `GET /v1/shadow` serves."""
    settings = settings or ApiSettings()
    names = engines.names
    resolve = model_resolver(names, engines.default)  # unknown names are told the served ones
    limits, keys = settings.limits, bool(settings.api_keys)
    keyed_service = keys and not settings.public_metrics_and_schema  # /metrics and /schema ask for the key too

    def service_key(connection: ASGIConnection, _handler=None) -> None:
        """The API key on /metrics and /schema (a guard): 403 without one, 401 with a wrong one."""
        if keyed_service:
            verdict = key_verdict(connection.headers.get("authorization"), settings.api_keys)
            if verdict == "missing":
                raise PermissionDeniedException(AUTH_MISSING)
            if verdict == "wrong":
                raise NotAuthorizedException(AUTH_WRONG)

    model_facts = ModelFacts(engines)
    parse_basal_body = basal_parser(engines, settings, model_facts)  # the batch lines' parser too (`body_decider`)

    @post(
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
    )
    async def systemone(request: Request) -> Response[SystemOneResponse]:
        return await handle_decision(
            request,
            "systemone",
            engines,
            settings,
            lambda raw: parse_systemone(
                raw,
                resolve,
                limits=limits,
                serves_evidence=model_facts.serves_evidence,
                prompt_bound=model_facts.prompt_bound,
            ),
        )

    @post(
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
    )
    async def basal(request: Request) -> Response[BasalResponse]:
        return await handle_decision(request, "basal", engines, settings, parse_basal_body)

    models_responses = {
        "200": {"description": "served models", "content": _json_content(ModelsResponse)},
        "503": {"description": "the models are still loading", "content": _json_content(SystemOneError)},
    }
    if keys:
        for status, what in (("401", "wrong API key"), ("403", "no API key")):
            models_responses[status] = {"description": what, "content": _json_content(SystemOneError)}

    @route(
        "/v1/models",
        http_method=["GET", "HEAD"],
        operation_class=documented(models_responses, secured=keys),
        summary="Served models",
        tags=["models"],
    )
    async def models(request: Request) -> Response:
        try:
            check_auth(request, settings, "systemone")
        except RequestError as e:
            return Response(e.body, status_code=e.status)
        if engines.progress:  # what a model computes with is known once its backend has loaded
            detail = "The models are still loading. Retry after a short delay (GET /health/ready says when)."
            return Response({"detail": detail}, status_code=503, headers=OVERLOADED_HEADERS)
        return Response(
            {
                "models": [
                    {
                        "name": info.name,
                        "release_date": settings.release_date,
                        "description": settings.descriptions.get(info.name, DESCRIPTION),
                        "mode": "basal",
                        "early_exit": [],
                        **capabilities(info),
                        "compute": info.compute,
                    }
                    for info in map(engines.model_info, names)
                ]
            }
        )

    if settings.metrics:
        metrics_responses = {
            "200": {
                "description": "Prometheus text format",
                "content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}},
            }
        }
        if keyed_service:
            for status, what in (("401", "wrong API key"), ("403", "no API key")):
                metrics_responses[status] = {"description": what, "content": _json_content(SystemOneError)}
    else:
        metrics_responses = {
            "404": {"description": "metrics are off (basal serve --metrics)", "content": _json_content(SystemOneError)}
        }

    @route(
        "/metrics",
        http_method=["GET"],
        operation_class=documented(metrics_responses, secured=keyed_service and settings.metrics),
        summary="Prometheus metrics (enable with --metrics)",
        tags=["service"],
        media_type=METRICS_MEDIA_TYPE,
    )
    async def metrics(request: Request) -> Response:
        if not settings.metrics:
            return Response({"detail": METRICS_OFF}, status_code=404, media_type="application/json")
        service_key(request)
        # off the loop: the process collector reads /proc, and a Ray front's collector asks its replicas
        text = await anyio.to_thread.run_sync(engines.metrics.render)
        return Response(text, media_type=METRICS_MEDIA_TYPE)

    async def shutdown() -> None:
        """Finish what is queued, then stop the lanes (uvicorn has already stopped accepting connections)."""
        await anyio.to_thread.run_sync(lambda: engines.close(drain=True))

    extra_routes, starts, stops = [], [], []
    if batches is not None:
        batches.attach(body_decider(engines, settings))
        extra_routes, starts, stops = batch_routes(batches, settings), [batches.start], [batches.stop]

    app = Litestar(
        route_handlers=[
            systemone,
            basal,
            models,
            *health_routes(engines),
            metrics,
            *playground_routes(),
            *shadow_routes(shadow, settings),
            *extra_routes,
        ],
        exception_handlers={HTTPException: litestar_http_exception, Exception: unhandled_exception},
        request_max_body_size=settings.max_body_bytes,
        cors_config=CORSConfig(allow_origins=list(settings.cors_origins)) if settings.cors_origins else None,
        openapi_config=OpenAPIConfig(
            title="basal",
            version=__version__,
            openapi_router=Router(SCHEMA_PATH, route_handlers=[], guards=[service_key], include_in_schema=False),
            render_plugins=schema_pages(),
            components=Components(
                security_schemes={BEARER: SecurityScheme(type="http", scheme="bearer", description="an API key")}
                if keys
                else None
            ),
        ),
        on_startup=[engines.start, *starts],
        on_shutdown=[*on_shutdown, *stops, shutdown],  # batch lines stop first (they run again at the next start)
        debug=False,
        logging_config=None,  # basal's own logging (the CLI's): one format, no queue thread of Litestar's
    )
    # outside Litestar's exception handling: every response (a 404, a 500) and every log line carries the id
    app.asgi_handler = RequestContext(app.asgi_handler, settings.access_log, settings.tracer)
    return app


def _json_content(tp: type) -> dict:
    return {"application/json": {"schema": json_schema(tp)}}
