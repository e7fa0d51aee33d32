"""API keys: the bearer key of a decision or Batch request, and the guard of /metrics and /schema."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection

from basal.api.context import api_context
from basal.api.errors import auth_error, service_auth_error
from basal.api.settings import ApiSettings


def check_auth(request: ASGIConnection, settings: ApiSettings, dialect: str) -> None:
    """Bearer key, compared in constant time on bytes: any header bytes (also >= 0x80) get 401, never a 500."""
    verdict = key_verdict(request.headers.get("authorization"), settings.api_keys)
    if verdict is not None:
        raise auth_error(missing=verdict == "missing", dialect=dialect)


def key_verdict(header: str | None, keys: tuple[str, ...]) -> str | None:
    """None when the request may pass (no keys configured, or a matching bearer key); else "missing" or "wrong"."""
    if not keys:
        return None
    if not header:
        return "missing"
    raw = header.encode("latin-1", errors="replace")  # ASGI header bytes, as Litestar decoded them
    scheme, _, key = raw.partition(b" ")
    key = key.strip()
    matched = False
    for k in keys:  # every key is compared, so timing does not tell which one is close
        matched |= hmac.compare_digest(key, k.encode("utf-8"))
    return None if scheme.lower() == b"bearer" and matched else "wrong"


def service_key(connection: ASGIConnection, _handler: object = None) -> None:
    """The API key on /metrics and /schema (a guard): 403 without one, 401 with a wrong one."""
    context = api_context(connection)
    if context.keyed_service:
        verdict = key_verdict(connection.headers.get("authorization"), context.settings.api_keys)
        if verdict is not None:
            raise service_auth_error(missing=verdict == "missing")
