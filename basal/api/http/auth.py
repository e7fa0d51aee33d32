"""API keys: the bearer key of a decision or Batch request, and the guard of /metrics and /schema."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection

from basal.api.context import api_context
from basal.api.errors import auth_error, service_auth_error
from basal.api.settings import ApiSettings, key_digest


def check_auth(request: ASGIConnection, settings: ApiSettings, dialect: str) -> None:
    """Bearer key, compared in constant time on bytes: any header bytes (also >= 0x80) get 401, never a 500."""
    verdict = key_verdict(request.headers.get("authorization"), settings.api_keys)
    if verdict is not None:
        raise auth_error(missing=verdict == "missing", dialect=dialect)


def bearer_key(header: str | None) -> bytes:
    """The key of an `Authorization: Bearer KEY` header as the bytes the client sent (b"" without one)."""
    raw = (header or "").encode("latin-1", errors="replace")  # ASGI header bytes, as Litestar decoded them
    return raw.partition(b" ")[2].strip()


def request_owner(request: ASGIConnection, settings: ApiSettings) -> str | None:
    """Whose request this is: the digest of its key (which `check_auth` let pass), None when no keys are set. The
    owner of the files and batches it creates, and its caches' scope (`ApiSettings.cache_scope`)."""
    if not settings.api_keys:
        return None
    return key_digest(bearer_key(request.headers.get("authorization")))


def visible_owner(request: ASGIConnection, settings: ApiSettings) -> str | None:
    """Whose files and batches a request may see: its key's own (a digest), or None for every one's — no keys set,
    `batches_shared`, or an admin key. Others' are answered as if they did not exist."""
    owner = request_owner(request, settings)
    if owner is None or settings.batches_shared or owner in settings.admin_owners:
        return None
    return owner


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
