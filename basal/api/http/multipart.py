"""A Batch input file's upload: `multipart/form-data` read from the ASGI stream, the file's bytes handed on as they
arrive.

The form is read as the SDK sends it, the fields first and the `file` part last; the file's bytes go, a STEP at a
time, to a `FilePart` (the upload route's: it checks them line by line and writes them to the store), never whole
in memory, and are refused (413) once over the limit. What an upload holds meanwhile counts in
`max_transit_bytes` with the decision bodies being received. Every refusal is a `batch_refusal`, in the Files API's
shape.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from litestar import Request

from basal.api.errors import ClientGone, batch_refusal
from basal.api.http.body import TransitBytes
from basal.core.errors import RequestError

MAX_FORM_HEAD = 64 << 10  # bytes of form fields and part headers before the file's bytes
STEP = 64 << 10  # bytes of the file handed on at once (few thread hops; a receive brings at most 256 KiB)


def _boundary(content_type: str) -> bytes:
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "multipart/form-data":
        raise batch_refusal(415, "invalid_content_type", "send the file as multipart/form-data (fields, then `file`)")
    match = re.search(r'boundary="?([^";]{1,200})"?', params)
    if not match:
        raise batch_refusal(400, "invalid_multipart", "the multipart/form-data Content-Type has no boundary")
    return match.group(1).encode("latin-1")


def _part_headers(raw: bytes) -> tuple[str, str | None]:
    """(field name, filename or None) of one part's headers."""
    text = raw.decode("utf-8", "replace")
    match = re.search(r"content-disposition:\s*form-data;([^\r\n]*)", text, re.IGNORECASE)
    if not match:
        raise batch_refusal(400, "invalid_multipart", "a form part lacks Content-Disposition: form-data")
    params = match.group(1)
    name = re.search(r'(?:^|;)\s*name="([^"]*)"', params)
    filename = re.search(r';\s*filename="([^"]*)"', params)
    if not name:
        raise batch_refusal(400, "invalid_multipart", "a form part has no name")
    return name.group(1), (filename.group(1) if filename else None)


def _check_filename(name: str) -> str:
    raw = name.encode("utf-8", "surrogateescape")
    if not 1 <= len(raw) <= 255 or any(c in '"\\' or unicodedata.category(c) == "Cc" for c in name):
        raise batch_refusal(
            400,
            "invalid_filename",
            "filename must have 1-255 UTF-8 bytes, without control characters, quotes or backslashes",
            "file",
        )
    return name


class FilePart(Protocol):
    """Where the file part's bytes go as they arrive: `write` runs in a worker thread (it checks and stores them),
    `held` is what it holds of them in memory between calls."""

    @property
    def held(self) -> int: ...

    def write(self, data: bytes) -> None: ...


async def read_upload(
    request: Request, limit: int, out: FilePart, transit: TransitBytes, transit_limit: int
) -> tuple[dict[str, str], str]:
    """Stream the form: -> (fields, filename), the file part's bytes handed to `out` as they arrive, STEP bytes at a
    time, off the event loop. The file part must come last; it is refused (413) once over `limit`. What this
    upload holds in memory (its unparsed form, bytes not yet handed on, what `out` holds) counts in `transit`
    against `transit_limit` while it is read (Overloaded past it)."""
    boundary = _boundary(request.headers.get("content-type", ""))
    delimiter = b"\r\n--" + boundary
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + MAX_FORM_HEAD:
        raise _too_large(limit)
    counted = 0  # bytes of this upload counted in `transit`

    def holding(n: int) -> None:
        nonlocal counted
        if n > counted:
            transit.take(n - counted, transit_limit)
        else:
            transit.give_back(counted - n)
        counted = n

    try:
        stream = _chunks(request)
        fields, filename, buffer = await _form_head(stream, delimiter, holding)
        keep = len(delimiter) + 8  # a delimiter split over two chunks is found in the kept tail
        size, pending, waiting, tail = 0, [], 0, buffer  # waiting: bytes in `pending`
        async for chunk in stream:
            tail += chunk
            if len(tail) > keep:
                pending.append(tail[:-keep])
                size += len(tail) - keep
                waiting += len(tail) - keep
                tail = tail[-keep:]
                if size > limit:
                    raise _too_large(limit)
            holding(waiting + len(tail) + out.held)
            if waiting >= STEP:
                await asyncio.to_thread(out.write, b"".join(pending))
                pending, waiting = [], 0
                holding(len(tail) + out.held)
        end = tail.find(delimiter)
        if end < 0:
            raise batch_refusal(400, "invalid_multipart", "the form does not end with its closing boundary", "file")
        if size + end > limit:
            raise _too_large(limit)
        if not tail[end + len(delimiter) :].startswith(b"--"):
            raise batch_refusal(400, "invalid_multipart", "the `file` part must be the form's last part", "file")
        await asyncio.to_thread(out.write, b"".join([*pending, tail[:end]]))
        return fields, filename
    finally:
        transit.give_back(counted)


async def _form_head(
    stream: AsyncIterator[bytes], delimiter: bytes, holding: Callable[[int], None]
) -> tuple[dict[str, str], str, bytes]:
    """The fields and the file part's headers: -> (fields, filename, the file's first bytes received)."""
    buffer = b"\r\n"  # the first delimiter has no CRLF before it
    fields: dict[str, str] = {}
    async for chunk in stream:
        buffer += chunk
        holding(len(buffer))
        while True:
            start = buffer.find(delimiter)
            if start < 0:
                break
            head_end = buffer.find(b"\r\n\r\n", start)
            if head_end < 0:
                break
            name, fname = _part_headers(buffer[start + len(delimiter) : head_end])
            body_start = head_end + 4
            if fname is not None:
                if name != "file":
                    raise batch_refusal(400, "invalid_multipart", "the file part must be named `file`", "file")
                return fields, _check_filename(fname), buffer[body_start:]
            end = buffer.find(delimiter, body_start)
            if end < 0:
                break
            fields[name] = buffer[body_start:end].decode("utf-8", "replace")
            buffer = buffer[end:]
        if len(buffer) > MAX_FORM_HEAD:
            raise batch_refusal(400, "invalid_multipart", "the form's fields are over 64 KiB, or it has no `file` part")
    raise batch_refusal(400, "missing_file", "the form has no `file` part (send the fields first, then `file`)", "file")


def _too_large(limit: int) -> RequestError:
    return batch_refusal(413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file")


async def _chunks(request: Request):
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
