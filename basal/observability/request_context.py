"""Around every HTTP request: its id (the client's when sane), the access log line, and the trace's server span.

The id is taken from `x-request-id` (or `x-typesafe-request-id`) when it is at most 128 characters of a safe set —
letters, digits and `._~:+/=-`, which covers UUIDs, ULIDs, base64 and the ids of common proxies — and generated
otherwise, so a hostile value never reaches a response header or a log line. It is set in `logs.REQUEST_ID` for the
task that serves the request (every log line of it carries the id) and sent back on every response.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import Any

from basal.observability.logs import REQUEST_FIELDS, REQUEST_ID
from basal.observability.tracing import Tracer

MAX_REQUEST_ID = 128
SAFE_ID = re.compile(rb"[A-Za-z0-9._~:+/=-]{1,128}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ID_HEADERS = (b"x-request-id", b"x-typesafe-request-id")

access = logging.getLogger("basal.access")
ACCESS_FORMAT = "%s %s %s %d %.3f ms"  # client, method, path, status, duration


def new_request_id() -> str:
    return f"req_{secrets.token_hex(16)}"


def client_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's id from the first id header present, if it is sane; None otherwise."""
    found = dict((k.lower(), v) for k, v in headers if k.lower() in ID_HEADERS)
    for name in ID_HEADERS:
        value = found.get(name)
        if value is not None:
            value = value.strip()
            return value.decode("ascii") if SAFE_ID.fullmatch(value) else None
    return None


def note(**fields: Any) -> None:
    """Facts about the request being served for its access line (the model, the engine's times)."""
    found = REQUEST_FIELDS.get()
    if found is not None:
        found.update(fields)


def current_request_id() -> str:
    """The id of the request being served (a fresh one outside a request: a test calling a handler directly)."""
    return REQUEST_ID.get() or new_request_id()


def _printable(text: str, limit: int = 512) -> str:
    """A path as one bounded log line: control characters escaped (a decoded `%0a` must not start a new line)."""
    text = text[:limit] + ("..." if len(text) > limit else "")
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def access_line(who: str, method: str | None, path: str, status: int, ms: float, fields: dict[str, Any]) -> None:
    """The request's access log line. The record is made and handled here rather than by `access.info`, which would
    walk the stack for the caller's file and line, read by no formatter of basal's, on every request."""
    if not access.isEnabledFor(logging.INFO):
        return
    extra = {"method": method, "path": path, "status": status, "duration_ms": ms, "client": who, **fields}
    args = (who, method or "", path, status, ms)
    access.handle(
        access.makeRecord(access.name, logging.INFO, __file__, 0, ACCESS_FORMAT, args, None, "access_line", extra)
    )


class RequestContext:
    """ASGI wrapper around the Litestar app's handler (inside its lifespan, outside its exception handling, so a
    500's log line and response carry the id too)."""

    def __init__(self, app: Any, access_log: bool = False, tracer: Tracer | None = None):
        self.app, self.access_log, self.tracer = app, access_log, tracer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        rid = client_request_id(headers) or new_request_id()
        token = REQUEST_ID.set(rid)
        fields: dict[str, Any] = {}
        fields_token = REQUEST_FIELDS.set(fields)
        started = time.perf_counter()
        status = 500  # if the app fails before it starts a response, uvicorn sends a 500
        echo = [(name, rid.encode("ascii")) for name in ID_HEADERS]

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                present = {k.lower() for k, _ in message.get("headers") or ()}
                extra = [h for h in echo if h[0] not in present]
                if extra:
                    message = {**message, "headers": [*(message.get("headers") or ()), *extra]}
            await send(message)

        span = self.tracer.server_span(scope, headers) if self.tracer else None
        try:
            if span is None:
                await self.app(scope, receive, send_with_id)
            else:
                with span as s:
                    await self.app(scope, receive, send_with_id)
                    s.set_attribute("http.response.status_code", status)
        finally:
            if self.access_log:
                ms = round((time.perf_counter() - started) * 1000, 3)
                path = _printable(scope.get("path", ""))
                client = scope.get("client")
                who = f"{client[0]}:{client[1]}" if client else "-"
                access_line(who, scope.get("method"), path, status, ms, fields)
            REQUEST_FIELDS.reset(fields_token)
            REQUEST_ID.reset(token)
