"""Every refusal core makes, and the one place in core that picks its HTTP status and its dialect's body.

A request that cannot be answered is a `RequestError(status, body)`, built by one of the constructors below:

* ``/v1/systemone`` (TypeSafe, strict): 422 ``{"detail": [...]}`` for shapes (FastAPI-style lists), 422
  ``{"error": "unsupported", ...}`` for what basal does not do, 400 with Jev's bodies for semantic limits.
* ``/v1/basal`` (upstream, lenient): 422 ``{"error": ...}`` for everything, with upstream's exception kept.

The engine's own refusals (overload, shutdown, a client gone) are exceptions whose status the HTTP layer picks
(`basal.api.errors`); nothing past the request parsers raises for bad input.
"""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A request that cannot be answered: HTTP `status` and the dialect's JSON `body`.

    `upstream` is the error as the upstream reference engine names it (``"ValueError: ..."``), kept so that
    `basal check-reference` can compare with the `upstream_error` of a reference export.
    """

    def __init__(self, status: int, body: Any, upstream: str | None = None):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body
        self.upstream = upstream


class ModelDirError(Exception):
    """A model directory that basal refuses to serve; the message says why and what to do."""


class Overloaded(Exception):
    """More than `max_inflight` requests are waiting or running (HTTP 529)."""


class EngineClosed(Exception):
    """The server is shutting down (HTTP 503)."""


class Loading(EngineClosed):
    """The models are still loading: the listener opens first (HTTP 503 with Retry-After, as a drain)."""


class Cancelled(Exception):
    """The client went away; its request was not computed (or its pass stopped at the next checkpoint)."""


def native_refusal(message: str, kind: str = "ValueError", upstream: str | None = None) -> RequestError:
    """/v1/basal: 422 ``{"error": message}``; `upstream` is upstream's own message where basal's says more."""
    return RequestError(422, {"error": message}, upstream=f"{kind}: {message if upstream is None else upstream}")


def systemone_shape(detail: list[dict[str, Any]]) -> RequestError:
    """/v1/systemone: 422 with FastAPI-style entries ``{"type", "loc", "msg", ...}``, every error at once."""
    return RequestError(422, {"detail": detail})


def systemone_unsupported(detail: list[dict[str, Any]]) -> RequestError:
    """/v1/systemone: a valid request that basal does not serve (an extension, a model without evidence, ...)."""
    return RequestError(422, {"error": "unsupported", "detail": detail})


def systemone_invalid(message: str) -> RequestError:
    """/v1/systemone: Jev's 400 ``{"detail": message}`` for a question it cannot ask."""
    return RequestError(400, {"detail": message})


def systemone_usage(message: str) -> RequestError:
    """/v1/systemone: Jev's 400 ``api_usage_error`` (an unknown model, a wrong field)."""
    return RequestError(400, {"detail": {"error_type": "api_usage_error", "message": message}})


def over_limit(dialect: str, message: str) -> RequestError:
    """A request over a work limit: Jev's token-limit 400 on /v1/systemone, upstream's 422 on /v1/basal."""
    if dialect == "systemone":
        return RequestError(400, {"detail": {"error_type": "max_tokens_exceeded", "message": message}})
    return RequestError(422, {"error": message})
