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

MAX_MESSAGE_CHARS = 1000  # one refusal's message, whatever it quotes from the request
DETAIL_CHARS = 200  # the default of `limits.max_echo_chars`: what one entry quotes of the request
DETAIL_ERRORS = 64  # the default of `limits.max_errors`: entries listed in one 422
NO_INPUT = object()  # `ErrorList.add`: the entry has no ``input`` field (the extensions' and facts' entries)


def cut(text: str, max_chars: int) -> str:
    """`text`, or its first `max_chars` characters and an ellipsis: a message never grows with the request."""
    return text if len(text) <= max_chars else text[:max_chars] + "…"


def preview(value: Any, max_chars: int = DETAIL_CHARS) -> Any:
    """A request value echoed in an error (``input``, ``ctx``): a long string is cut, a large object is ``…``."""
    if isinstance(value, str):
        return cut(value, max_chars)
    if isinstance(value, dict | list) and not fits(value, max_chars):
        return "…"
    return value


def fits(value: Any, budget: int) -> bool:
    """Whether a JSON value encodes to about `budget` bytes or fewer; stops counting once past it."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            budget -= 2 + len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            budget -= 2 + len(v)
            stack.extend(v)
        else:
            budget -= len(v) + 2 if isinstance(v, str) else 8
        if budget < 0:
            return False
    return True


class ErrorList:
    """The one collector of every listed error (FastAPI-style entries ``{"type", "loc", "msg", ...}``): at most
    `max_errors` entries, every string of an entry cut to `max_echo_chars` (messages to `MAX_MESSAGE_CHARS`),
    and a last entry that says more were not listed. So a 422 stays the same size however malformed the request
    is; callers that build costly messages check `full` first."""

    def __init__(self, max_errors: int = DETAIL_ERRORS, max_echo_chars: int = DETAIL_CHARS) -> None:
        self.items: list[dict[str, Any]] = []
        self.max_errors, self.max_echo_chars = max_errors, max_echo_chars
        self.unlisted = 0
        self.stopped = False  # checking stopped once the list was full

    @property
    def full(self) -> bool:
        return len(self.items) >= self.max_errors

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, type_: str, loc: list[Any], msg: str, value: Any = NO_INPUT, **ctx: Any) -> None:
        """One entry at ``["body", *loc]``; `value` is echoed as ``input`` unless it is `NO_INPUT`."""
        if self.full:
            self.unlisted += 1
            return
        n = self.max_echo_chars
        err: dict[str, Any] = {
            "type": cut(type_, n),
            "loc": ["body", *(cut(part, n) if isinstance(part, str) else part for part in loc)],
            "msg": cut(msg, MAX_MESSAGE_CHARS),
        }
        if value is not NO_INPUT:
            err["input"] = preview(value, n)
        if ctx:
            err["ctx"] = {k: preview(v, n) for k, v in ctx.items()}
        self.items.append(err)

    def listed(self) -> list[dict[str, Any]]:
        """The entries, with the last one saying how many were left out (if any were)."""
        if not (self.unlisted or self.stopped):
            return self.items
        more = f"more errors are not listed (at most {self.max_errors} are)"
        return [*self.items, {"type": "too_many_errors", "loc": ["body"], "msg": more}]

    def refusal(self) -> RequestError:
        """The shape 422 of the errors collected."""
        return systemone_shape(self.listed())

    def unsupported(self) -> RequestError:
        """The ``unsupported`` 422 of the capability errors collected."""
        return systemone_unsupported(self.listed())


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
    shown = cut(message, MAX_MESSAGE_CHARS)
    return RequestError(422, {"error": shown}, upstream=f"{kind}: {message if upstream is None else upstream}")


def systemone_shape(detail: list[dict[str, Any]]) -> RequestError:
    """/v1/systemone: 422 with FastAPI-style entries ``{"type", "loc", "msg", ...}`` (listed by an `ErrorList`)."""
    return RequestError(422, {"detail": detail})


def systemone_unsupported(detail: list[dict[str, Any]]) -> RequestError:
    """/v1/systemone: a valid request that basal does not serve (an extension, a model without evidence, ...)."""
    return RequestError(422, {"error": "unsupported", "detail": detail})


def systemone_invalid(message: str) -> RequestError:
    """/v1/systemone: Jev's 400 ``{"detail": message}`` for a question it cannot ask."""
    return RequestError(400, {"detail": cut(message, MAX_MESSAGE_CHARS)})


def systemone_usage(message: str) -> RequestError:
    """/v1/systemone: Jev's 400 ``api_usage_error`` (an unknown model, a wrong field)."""
    return RequestError(400, {"detail": {"error_type": "api_usage_error", "message": cut(message, MAX_MESSAGE_CHARS)}})


def over_limit(dialect: str, message: str) -> RequestError:
    """A request over a work limit: Jev's token-limit 400 on /v1/systemone, upstream's 422 on /v1/basal."""
    message = cut(message, MAX_MESSAGE_CHARS)
    if dialect == "systemone":
        return RequestError(400, {"detail": {"error_type": "max_tokens_exceeded", "message": message}})
    return RequestError(422, {"error": message})
