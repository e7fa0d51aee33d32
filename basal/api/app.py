"""The Litestar application: the routes of `routes/`, Litestar's own errors, the OpenAPI document, the lifecycle.

`create_app(engines, settings)` builds the app around engines that are already loaded, so tests can serve the
demo model in-process and `basal serve` can load real models first, with progress, before it listens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import msgspec
from litestar import Litestar, Request, Response, Router
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from litestar.plugins import PluginProtocol

from basal import __version__
from basal.api.context import ApiContext, api_context
from basal.api.decide import body_decider, parsers
from basal.api.errors import OVERLOADED_HEADERS, batch_refusal
from basal.api.http.auth import service_key
from basal.api.routes.batches import batch_routes
from basal.api.routes.decisions import decision_routes
from basal.api.routes.health import health_routes
from basal.api.routes.metrics import metrics_routes
from basal.api.routes.models import model_routes
from basal.api.routes.openai_decisions import openai_decisions_routes
from basal.api.routes.playground import playground_routes
from basal.api.routes.shadow import shadow_routes
from basal.api.settings import ApiSettings
from basal.api.wire.batch_types import ApiError
from basal.api.wire.openapi import BEARER
from basal.api.wire.schema_pages import SCHEMA_HEADERS, SCHEMA_PATH, schema_pages
from basal.batch.service import BatchService
from basal.batch.store import Unavailable
from basal.core.engine.front import EnginesFront
from basal.core.engine.shadow import ShadowFront
from basal.core.errors import RequestError, cut
from basal.observability.request_context import RequestContext

log = logging.getLogger(__name__)

MESSAGE_WORDS = 200  # characters of a Batch refusal's own words, beside what it quotes (`limits.max_echo_chars`)


class MsgspecLitestar(Litestar):
    """Litestar with the plugins basal's types need: its msgspec one (every wire type is a msgspec Struct). Litestar
    adds its pydantic and attrs plugins whenever those packages are installed (any development environment), and
    importing them cost about 70 ms of CPU at every start (`bench/lab/start_times.py`)."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        from litestar.plugins.core import MsgspecDIPlugin

        return [*plugins, MsgspecDIPlugin()]


def create_app(
    engines: EnginesFront,
    settings: ApiSettings | None = None,
    on_shutdown: Sequence[Callable] = (),
    batches: BatchService | None = None,
    shadow: ShadowFront | None = None,
    on_startup: Sequence[Callable] = (),
) -> Litestar:
    """`batches`: serve the Files and Batches API (docs/batches.md) from this service's store. `shadow`: the front
    that shadows models (`engines` or a front inside it), whose summary `GET /v1/shadow` serves."""
    settings = settings or ApiSettings()
    context = ApiContext(engines, settings, parsers(engines, settings), batches, shadow)
    routes = [*decision_routes(settings), *model_routes(settings), *health_routes(), *metrics_routes(settings)]
    routes += playground_routes() + shadow_routes(shadow)
    routes += openai_decisions_routes(settings)
    starts, stops = [engines.start, *on_startup], [*on_shutdown]
    if batches is not None:
        batches.attach(
            lambda owner: body_decider(engines, settings, context.parsers["basal"], owner=owner), engines.metrics
        )
        routes += batch_routes(settings)
        starts.append(batches.start)
        stops.append(batches.stop)  # batch lines stop first (they run again at the next start)

    async def shutdown() -> None:
        """Finish what is queued, then stop the lanes (uvicorn has already stopped accepting connections)."""
        await anyio.to_thread.run_sync(lambda: engines.close(drain=True))

    app = MsgspecLitestar(
        route_handlers=routes,
        state=State({"api": context}),
        exception_handlers={
            RequestError: refusal_response,
            Unavailable: store_unavailable,
            HTTPException: litestar_http_exception,
            Exception: unhandled_exception,
        },
        request_max_body_size=settings.max_body_bytes,
        cors_config=CORSConfig(allow_origins=list(settings.cors_origins)) if settings.cors_origins else None,
        openapi_config=openapi_config(bool(settings.api_keys)),
        on_startup=starts,
        on_shutdown=[*stops, shutdown],
        debug=False,
        logging_config=None,  # basal's own logging (the CLI's): one format, no queue thread of Litestar's
    )
    # outside Litestar's exception handling: every response (a 404, a 500) and every log line carries the id
    app.asgi_handler = RequestContext(app.asgi_handler, settings.access_log, settings.tracer)
    return app


def openapi_config(keys: bool) -> OpenAPIConfig:
    """The document under /schema (behind the API key where /metrics asks for it), with the Bearer scheme when
    keys are set."""
    return OpenAPIConfig(
        title="basal",
        version=__version__,
        openapi_router=Router(
            SCHEMA_PATH,
            route_handlers=[],
            guards=[service_key],
            include_in_schema=False,
            response_headers=SCHEMA_HEADERS,
        ),
        render_plugins=schema_pages(),
        components=Components(
            security_schemes={BEARER: SecurityScheme(type="http", scheme="bearer", description="an API key")}
            if keys
            else None
        ),
    )


def refusal_response(request: Request, exc: RequestError) -> Response:
    """A refusal raised by a route or a guard (`api/errors.py`), as its status and body (a dict, or a wire Struct:
    the Batch routes' `ApiError`, whose message is cut to `max_echo_chars` beyond its own words, so whatever it
    quotes of the request never makes it grow with the request). The decision routes answer their own
    (`handle_decision` never raises)."""
    body = exc.body
    if isinstance(body, ApiError):
        limit = api_context(request).settings.limits.max_echo_chars + MESSAGE_WORDS
        body = msgspec.structs.replace(
            body, error=msgspec.structs.replace(body.error, message=cut(body.error.message, limit))
        )
    return Response(body, status_code=exc.status, headers=OVERLOADED_HEADERS if exc.status == 529 else None)


def store_unavailable(request: Request, exc: Unavailable) -> Response:
    """The Batch store's shared database cannot be reached now (it restarts): a 503 the client retries."""
    return refusal_response(
        request, batch_refusal(503, "store_unavailable", "the batch store's database is unavailable; retry")
    )


def litestar_http_exception(request: Request, exc: HTTPException) -> Response:
    """Litestar's own errors (unknown path, wrong method, body over the size limit) with FastAPI-style bodies."""
    detail = {404: "Not Found", 405: "Method Not Allowed", 413: "Request body too large."}.get(
        exc.status_code, exc.detail
    )
    return Response({"detail": detail}, status_code=exc.status_code, headers=exc.headers)


def unhandled_exception(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s", request.url.path, exc_info=exc)
    return Response({"detail": "Internal Server Error"}, status_code=500)
