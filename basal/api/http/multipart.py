"""A Batch input file's upload: `multipart/form-data` read from the ASGI stream straight into a file.

The form is read as the SDK sends it, the fields first and the `file` part last; the file's bytes are written as
they arrive (never whole in memory before the size check) and refused (413) once over the limit. Every refusal is a
`batch_refusal`, in the Files API's shape.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from litestar import Request

from basal.api.errors import ClientGone, batch_refusal

MAX_FORM_HEAD = 64 << 10  # bytes of form fields and part headers before the file's bytes


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


async def read_upload(request: Request, limit: int, tmp: Path) -> tuple[dict[str, str], str]:
    """Stream the form into `tmp`: -> (fields, filename). The file part must come last; its bytes are written as
    they arrive and refused (413) once over `limit`."""
    boundary = _boundary(request.headers.get("content-type", ""))
    delimiter = b"\r\n--" + boundary
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + MAX_FORM_HEAD:
        raise batch_refusal(413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file")
    buffer = b"\r\n"  # the first delimiter has no CRLF before it
    fields: dict[str, str] = {}
    filename = None
    stream = _chunks(request)
    async for chunk in stream:  # fields, then the file part's headers
        buffer += chunk
        while filename is None:
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
                filename, buffer = _check_filename(fname), buffer[body_start:]
                break
            end = buffer.find(delimiter, body_start)
            if end < 0:
                break
            fields[name] = buffer[body_start:end].decode("utf-8", "replace")
            buffer = buffer[end:]
        if filename is not None:
            break
        if len(buffer) > MAX_FORM_HEAD:
            raise batch_refusal(400, "invalid_multipart", "the form's fields are over 64 KiB, or it has no `file` part")
    if filename is None:
        raise batch_refusal(
            400, "missing_file", "the form has no `file` part (send the fields first, then `file`)", "file"
        )
    keep = len(delimiter) + 8  # a delimiter split over two chunks is found in the kept tail
    size = 0
    with open(tmp, "wb") as out:
        tail = buffer
        async for chunk in stream:
            tail += chunk
            if len(tail) > keep:
                out.write(tail[:-keep])
                size += len(tail) - keep
                tail = tail[-keep:]
                if size > limit:
                    raise batch_refusal(
                        413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file"
                    )
        end = tail.find(delimiter)
        if end < 0:
            # the delimiter may straddle what was already written: look in the file's end too
            out.flush()
            raise batch_refusal(400, "invalid_multipart", "the form does not end with its closing boundary", "file")
        out.write(tail[:end])
        size += end
        if size > limit:
            raise batch_refusal(413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file")
        if not tail[end + len(delimiter) :].startswith(b"--"):
            raise batch_refusal(400, "invalid_multipart", "the `file` part must be the form's last part", "file")
        out.flush()
        os.fsync(out.fileno())
    return fields, filename


async def _chunks(request: Request):
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
