"""The JSONL of the Batch API: input lines in, result records out (docs/batches.md).

An input line is `{"custom_id", "method": "POST", "url": "/v1/basal", "body": a native request}`. A line that
cannot be read (not UTF-8 JSON, nested past the decoder's depth, not that shape, over the line size limit)
becomes an error record whose message is bounded; the file is refused at upload only when it cannot be a batch
at all (`check_upload`). A UTF-8 byte order mark at the start of the file (as some Windows editors write) is
skipped. Records are built as bytes around
the answer's own bytes, so a record's `response.body` is byte for byte what `POST /v1/basal` answers.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import msgspec

from basal.core.errors import DETAIL_CHARS, cut

MAX_CUSTOM_ID_BYTES = 256
ENDPOINT = "/v1/basal"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


@dataclass(frozen=True)
class Line:
    """A readable input line: its 1-based number, custom_id and the body to decide (as JSON bytes)."""

    number: int
    custom_id: str
    body: bytes
    group: bytes  # lines with equal groups share a state: the runner sends them together


@dataclass(frozen=True)
class BadLine:
    """A line that cannot be run: it gets an error record with this code and message."""

    number: int
    custom_id: str
    code: str
    message: str


class UploadRefused(ValueError):
    """The file cannot be a batch input (HTTP 400): the message says why."""


def split(data: bytes) -> list[bytes]:
    """The lines of a JSONL file: LF or CRLF ends a line; a final line may lack its LF; a BOM before the first
    line is not part of it."""
    lines = data.removeprefix(BOM).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def unreadable_line_id(number: int) -> str:
    """The custom_id of an error record for a line whose own cannot be read."""
    return f"line:{number}"


def parse(number: int, raw: bytes, max_line_bytes: int) -> Line | BadLine:
    """One input line -> a Line to run, or a BadLine (an error record)."""
    if len(raw) > max_line_bytes:
        return BadLine(number, _peek_id(raw, number), "line_too_large", f"line is over {max_line_bytes} bytes")
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:  # ValidationError too: a number out of range
        return BadLine(
            number,
            unreadable_line_id(number),
            "invalid_json",
            f"line {number} is not JSON: {cut(str(e), DETAIL_CHARS)}",
        )
    except RecursionError:
        return BadLine(
            number, unreadable_line_id(number), "invalid_json", f"line {number} is nested too deeply to be read"
        )
    if not isinstance(value, dict):
        return BadLine(number, unreadable_line_id(number), "invalid_request", "a line must be a JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id.encode("utf-8", "surrogatepass")) <= 256:
        return BadLine(
            number, unreadable_line_id(number), "invalid_custom_id", "custom_id must be a string of 1-256 UTF-8 bytes"
        )
    problem = _envelope_problem(value)
    if problem:
        return BadLine(number, custom_id, "invalid_request", problem)
    body = value["body"]
    try:  # what was decoded encodes again, unless the stack here is deeper than where it was decoded
        group = msgspec.json.encode([body.get("model"), body.get("state"), body.get("lang"), body.get("facts")])
        return Line(number, custom_id, msgspec.json.encode(body), group)
    except RecursionError:
        return BadLine(number, custom_id, "invalid_json", f"line {number} is nested too deeply to be read")


def _envelope_problem(value: dict[str, Any]) -> str:
    unknown = set(value) - {"custom_id", "method", "url", "body"}
    if unknown:
        return cut(f"unknown fields in the line: {', '.join(sorted(unknown))}", DETAIL_CHARS)
    if value.get("method") != "POST":
        return 'method must be "POST"'
    if value.get("url") != ENDPOINT:
        return f'url must be "{ENDPOINT}"'
    body = value.get("body")
    if not isinstance(body, dict):
        return "body must be a JSON object (a native /v1/basal request)"
    if body.get("stream") is True:
        return "body.stream must not be true: batch records do not stream"
    return ""


def _peek_id(raw: bytes, number: int) -> str:
    """The custom_id of an oversized line, if its start shows one (the line is not decoded whole)."""
    head = raw[:400]
    start = head.find(b'"custom_id"')
    if start >= 0:
        rest = head[start + 11 :].lstrip(b" :")
        end = rest.find(b'"', 1)
        if rest.startswith(b'"') and end > 1:
            try:
                candidate = msgspec.json.decode(rest[: end + 1])
            except msgspec.DecodeError:
                candidate = None
            if isinstance(candidate, str) and 1 <= len(candidate.encode()) <= MAX_CUSTOM_ID_BYTES:
                return candidate
    return unreadable_line_id(number)


def check_upload(data: bytes, max_lines: int, max_line_bytes: int) -> list[Line | BadLine]:
    """The parsed lines of an upload, or UploadRefused: no lines, too many, a custom_id given twice, or not one
    line that is a batch request (some other file uploaded by mistake)."""
    lines = split(data)
    if not lines:
        raise UploadRefused("the file is empty: a batch input has one JSON request per line")
    if len(lines) > max_lines:
        raise UploadRefused(f"the file has {len(lines)} lines; the limit is {max_lines} (split it into batches)")
    parsed = [parse(i, raw, max_line_bytes) for i, raw in enumerate(lines, 1)]
    seen: dict[str, int] = {}
    for p in parsed:  # every record's custom_id is unique, the ids given to unreadable lines (`line:N`) too
        if p.custom_id in seen:
            raise UploadRefused(
                f"custom_id {p.custom_id!r} is on line {seen[p.custom_id]} and again on line {p.number}: "
                "each line needs its own custom_id"
            )
        seen[p.custom_id] = p.number
    if not any(isinstance(p, Line) for p in parsed):
        first = parsed[0]
        assert isinstance(first, BadLine)
        raise UploadRefused(f"no line is a batch request; line 1: {first.message}")
    return parsed


def record_id() -> str:
    return "batch_req_" + secrets.token_hex(16)


def response_record(custom_id: str, status: int, body: bytes, request_id: str) -> bytes:
    """An output (or, for a status other than 200, error) record around the answer's exact bytes."""
    head = msgspec.json.encode({"id": record_id(), "custom_id": custom_id})[:-1]
    response = b'{"status_code":%d,"request_id":%s,"body":' % (status, msgspec.json.encode(request_id))
    return head + b',"response":' + response + body + b'},"error":null}'


def error_record(custom_id: str, code: str, message: str) -> bytes:
    return msgspec.json.encode(
        {"id": record_id(), "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}
    )
