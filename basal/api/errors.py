"""Every failure -> (status, body, headers) in the caller's dialect: the one place in the HTTP layer that picks a
status (the refusals of the request parsers come from `basal.core.errors` with theirs).

Every refusal is a `RequestError` (status and the body its routes answer): the decision dialects' bodies, and the
Files and Batches API's `{"error": {message, type, param, code}}` (`batch_refusal`). No web framework is imported
here: `basal run-batch` maps a batch line's failures with the same function as the server.
"""

from __future__ import annotations

import logging
from typing import Any

from basal.api.wire.batch_types import ApiError, ErrorDetail
from basal.core.errors import Cancelled, EngineClosed, Loading, Overloaded, RequestError

log = logging.getLogger(__name__)

STATUS_CLIENT_CLOSED = 499  # nginx's code: the client went away; nobody reads it, metrics and logs do
OVERLOADED_HEADERS = {"retry-after": "1", "retry-after-ms": "1000"}
AUTH_MISSING = "Must supply an API key! Check your request and try again."
AUTH_WRONG = "Cannot authenticate with the server. Please check your API key and try again."


def error_response(exc: Exception, dialect: str) -> tuple[int, Any, dict[str, str]]:
    """An exception from the request parsers or the engine -> (status, body, extra headers)."""
    if isinstance(exc, RequestError):
        return exc.status, exc.body, {}
    if isinstance(exc, Overloaded):
        if dialect == "basal":
            return 529, {"error": "overloaded: too many requests in flight"}, OVERLOADED_HEADERS
        return (
            529,
            {
                "detail": {
                    "error_type": "overloaded_error",
                    "message": "Too many requests in flight. Retry after a short delay.",
                }
            },
            OVERLOADED_HEADERS,
        )
    if isinstance(exc, EngineClosed):
        message = "The server is shutting down. Retry on another instance."
        if isinstance(exc, Loading):
            message = "The models are still loading. Retry after a short delay (GET /health/ready says when)."
        return 503, ({"error": message} if dialect == "basal" else {"detail": message}), OVERLOADED_HEADERS
    if isinstance(exc, Cancelled | ClientGone):
        return STATUS_CLIENT_CLOSED, {"detail": "client closed the request"}, {}
    log.error("internal error", exc_info=exc)
    return 500, ({"error": "internal error"} if dialect == "basal" else {"detail": "Internal Server Error"}), {}


def _refusal(status: int, message: str, dialect: str) -> RequestError:
    return RequestError(status, {"error": message} if dialect == "basal" else {"detail": message})


def unsupported_media_type(message: str, dialect: str) -> RequestError:
    """415: a Content-Type other than JSON, or a Content-Encoding basal does not read."""
    return _refusal(415, message, dialect)


def too_large(message: str, dialect: str) -> RequestError:
    """413: a body (or its decompressed size) over the limit."""
    return _refusal(413, message, dialect)


def undecodable(message: str, dialect: str) -> RequestError:
    """400: a body that its Content-Encoding cannot decode."""
    return _refusal(400, message, dialect)


def auth_error(missing: bool, dialect: str) -> RequestError:
    status, message = (403, AUTH_MISSING) if missing else (401, AUTH_WRONG)
    if dialect == "basal":
        return RequestError(status, {"error": message})
    return RequestError(status, {"detail": {"error_type": "authentication_error", "message": message}})


def service_auth_error(missing: bool) -> RequestError:
    """403 without a key, 401 with a wrong one, on /metrics and /schema (not a decision: the plain `detail` body)."""
    return RequestError(403, {"detail": AUTH_MISSING}) if missing else RequestError(401, {"detail": AUTH_WRONG})


def not_found() -> RequestError:
    """404, as Litestar answers a path it does not route (`app.litestar_http_exception`)."""
    return RequestError(404, {"detail": "Not Found"})


BATCH_ERROR_TYPES = {
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    507: "server_error",
    529: "server_error",
}


def batch_refusal(status: int, code: str, message: str, param: str | None = None) -> RequestError:
    """A refusal of the Files and Batches API, in the shape an OpenAI-Batch user reads: `code` says what was wrong,
    `param` which parameter it is about."""
    kind = BATCH_ERROR_TYPES.get(status, "invalid_request_error")
    return RequestError(status, ApiError(error=ErrorDetail(message=message, type=kind, param=param, code=code)))


class ClientGone(Exception):
    """The client closed the connection before its body arrived (HTTP 499 in logs and metrics)."""
