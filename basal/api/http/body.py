"""Request bodies: Content-Type, reading with a size limit, Content-Encoding (the TypeSafe SDK zstd-compresses
bodies >= 1 KB). Reading happens on the event loop (it is I/O); decompressing and decoding large bodies do not."""

from __future__ import annotations

import io
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import zstandard

from basal.api.errors import ClientGone, too_large, undecodable, unsupported_media_type
from basal.core.errors import Overloaded

JSON_MEDIA_TYPE = "application/json"


def check_content_type(headers: Mapping[str, str], dialect: str) -> None:
    """Only JSON is read: a browser may send text/plain or a form cross-origin without asking (415 otherwise)."""
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        shown = repr(media[:100]) if media else "none"
        raise unsupported_media_type(f"Unsupported Content-Type {shown}: send Content-Type: application/json.", dialect)


class TransitBytes:
    """Bytes of request bodies received so far by requests still receiving theirs, over all connections.

    Bodies are read before a request takes a decision slot, so a slow body holds no decision capacity; what it
    holds is the bytes it has sent, counted here against `limits.max_transit_bytes` (past it: 529). A client that
    trickles a byte every few seconds holds a few bytes, not a slot; `body_timeout_s` ends it
    (`connection_guard`). Used on the event loop only (no lock)."""

    def __init__(self) -> None:
        self.bytes = 0

    def take(self, n: int, limit: int) -> None:
        if self.bytes + n > limit:
            raise Overloaded()
        self.bytes += n

    def give_back(self, n: int) -> None:
        self.bytes -= n


async def read_body(
    receive: Callable[[], Awaitable[dict[str, Any]]],
    headers: Mapping[str, str],
    limit: int,
    dialect: str,
    transit: TransitBytes | None = None,
    transit_limit: int = 0,
) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes (before it is read, by
    Content-Length, where the client sends one); ClientGone if the client hangs up first. With `transit`, its
    bytes count against `transit_limit` while it is received (Overloaded past it)."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large("Request body too large.", dialect)
    chunks, size = [], 0
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            if size + len(chunk) > limit:
                raise too_large("Request body too large.", dialect)
            if transit is not None:
                transit.take(len(chunk), transit_limit)
            size += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    finally:
        if transit is not None:
            transit.give_back(size)


def decompress(body: bytes, encoding: str | None, limit: int, dialect: str = "systemone") -> bytes:
    """Decode gzip / deflate / zstd bodies, refusing anything that inflates past `limit` bytes (413)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    try:
        if encoding in ("gzip", "x-gzip", "deflate"):
            d = zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)  # 47: gzip or zlib header
            out = d.decompress(body, limit + 1)
        elif encoding == "zstd":
            parts, size = [], 0
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
                while size <= limit:  # never inflate past the limit (decompression bombs)
                    part = reader.read(min(1 << 20, limit + 1 - size))
                    if not part:
                        break
                    parts.append(part)
                    size += len(part)
            out = b"".join(parts)
        else:
            shown = encoding[:100]
            raise unsupported_media_type(
                f"Unsupported Content-Encoding: {shown}. Send identity, gzip, deflate or zstd.", dialect
            )
    except (zlib.error, zstandard.ZstdError) as e:
        raise undecodable(f"The body is not valid {encoding} data: {e}", dialect) from e
    if len(out) > limit:
        raise too_large(f"The decompressed body is larger than {limit} bytes.", dialect)
    return out
