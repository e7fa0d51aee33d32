"""The JSONL of the Batch API: input lines in, result records out (docs/batches.md).

An input line is `{"custom_id", "method": "POST", "url": "/v1/basal", "body": a native request}`. A line that
cannot be read (not UTF-8 JSON, nested past the decoder's depth, not that shape, over the line size limit)
becomes an error record whose message is bounded; the file is refused at upload only when it cannot be a batch
at all (`check_upload`). A UTF-8 byte order mark at the start of the file (as some Windows editors write) is
skipped. Records are built as bytes around
the answer's own bytes, so a record's `response.body` is byte for byte what `POST /v1/basal` answers.

A file is read as its bytes arrive (`LineSplitter`, `UploadCheck`): an upload is checked while it streams in, and a
batch's input file is indexed (`InputFile`) and its lines read again when they run, so neither holds more than a
line's bytes at a time, whatever the file's size.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from basal.core.errors import DETAIL_CHARS, cut

MAX_CUSTOM_ID_BYTES = 256
ENDPOINT = "/v1/basal"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark
HEAD_BYTES = 400  # of a line over the size limit, only its start is kept: enough to show its custom_id
GROUP_PREFIX = 256  # bytes of a group kept in an index; a longer group is its prefix and a digest of the rest
READ_BYTES = 1 << 20  # bytes of a file read at once while it is indexed


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


class RawLine(NamedTuple):
    """One line of a file as `LineSplitter` found it: `data` is the whole line (without its CR LF) when
    `complete`, else only the start of a line over the size limit (whose other bytes were not kept)."""

    number: int
    offset: int  # where the line starts in the file
    data: bytes
    complete: bool


class LineSplitter:
    """A JSONL file's lines as its bytes arrive: LF or CRLF ends a line, a final line may lack its LF, a BOM before
    the first line is not part of it (as `split`). At most `max_line_bytes` + 1 bytes of a line are held: a longer
    one is kept by its first HEAD_BYTES only, which is all its error record needs."""

    def __init__(self, max_line_bytes: int):
        self.max_line_bytes = max_line_bytes
        self.number = 0  # lines ended so far
        self._position = 0  # bytes of the file seen so far
        self._start = b""  # the file's first bytes, while they may still be a BOM
        self._started = False
        self._parts: list[bytes] = []  # the line in progress (or, over the limit, its start)
        self._size = 0  # bytes of the line in progress, all of them
        self._over = False
        self._line_at = 0

    @property
    def held(self) -> int:
        """Bytes of the file this holds now (the line in progress)."""
        return len(self._start) + (len(self._parts[0]) if self._over else self._size)

    def feed(self, data: bytes) -> list[RawLine]:
        """The lines that `data` ends (a line's end may come many calls after its start)."""
        if not self._started:
            self._start += data
            if len(self._start) < len(BOM) and BOM.startswith(self._start):
                return []
            data, self._start = self._begin(self._start), b""
        lines, at, base = [], 0, self._position
        while (end := data.find(b"\n", at)) >= 0:
            self._hold(data[at:end])
            lines.append(self._end())
            at = end + 1
            self._line_at = base + at
        if at < len(data):
            self._hold(data[at:])
        self._position += len(data)
        return lines

    def end(self) -> list[RawLine]:
        """The file's last line, if it lacks its LF (call once the file has no more bytes)."""
        if not self._started:
            data, self._start = self._begin(self._start), b""
            self._hold(data)
            self._position += len(data)
        return [self._end()] if self._size else []

    def _begin(self, data: bytes) -> bytes:
        """The file's first bytes without their BOM, if they start with one."""
        self._started = True
        if data.startswith(BOM):
            self._position = self._line_at = len(BOM)
        return data.removeprefix(BOM)

    def _hold(self, part: bytes) -> None:
        if not part:
            return
        if not self._over and self._size + len(part) > self.max_line_bytes + 1:  # over even without a CR
            self._over = True
            self._parts = [b"".join(self._parts)[:HEAD_BYTES]]
        if not self._over:
            self._parts.append(part)
        elif len(self._parts[0]) < HEAD_BYTES:
            self._parts[0] += part[: HEAD_BYTES - len(self._parts[0])]
        self._size += len(part)

    def _end(self) -> RawLine:
        self.number += 1
        data = b"".join(self._parts)
        if not self._over or self._size == len(data):
            data = data.removesuffix(b"\r")
        line = RawLine(self.number, self._line_at, data, not self._over)
        self._parts, self._size, self._over = [], 0, False
        return line


def read_line(raw: RawLine, max_line_bytes: int) -> Line | BadLine:
    """A line that `LineSplitter` found -> a Line to run, or a BadLine (as `parse`)."""
    if raw.complete:
        return parse(raw.number, raw.data, max_line_bytes)
    return BadLine(raw.number, _peek_id(raw.data, raw.number), "line_too_large", f"line is over {max_line_bytes} bytes")


class UploadCheck:
    """`check_upload`'s rules for a file fed as its bytes arrive, holding one line at a time and, to find a
    custom_id given twice, a 128-bit digest of each (a false match is as likely as guessing a random 128-bit key).
    Once the file is refused (too many lines, an id twice), its remaining lines are only counted. `keep`, if
    given, makes `kept` the list of what it returns for each line."""

    def __init__(
        self,
        max_lines: int,
        max_line_bytes: int,
        keep: Callable[[RawLine, Line | BadLine], Any] | None = None,
    ):
        self.max_lines, self.max_line_bytes, self.keep = max_lines, max_line_bytes, keep
        self.splitter = LineSplitter(max_line_bytes)
        self.kept: list = []
        self._seen: dict[bytes, int] = {}  # custom_id's digest -> the line it is on
        self._twice = ""  # the first custom_id given twice, as the refusal says it
        self._runnable = False  # a line is a batch request
        self._first = ""  # line 1's problem, when it is not a request

    @property
    def held(self) -> int:
        """Bytes of the file this holds now (the line in progress)."""
        return self.splitter.held

    def feed(self, data: bytes) -> None:
        for raw in self.splitter.feed(data):
            self._check(raw)

    def finish(self) -> int:
        """The file's line count once it has no more bytes, or UploadRefused: no lines, too many, a custom_id given
        twice, or not one line that is a batch request (some other file uploaded by mistake)."""
        for raw in self.splitter.end():
            self._check(raw)
        count = self.splitter.number
        if not count:
            raise UploadRefused("the file is empty: a batch input has one JSON request per line")
        if count > self.max_lines:
            raise UploadRefused(f"the file has {count} lines; the limit is {self.max_lines} (split it into batches)")
        if self._twice:
            raise UploadRefused(self._twice)
        if not self._runnable:
            raise UploadRefused(f"no line is a batch request; line 1: {self._first}")
        return count

    def _check(self, raw: RawLine) -> None:
        if raw.number > self.max_lines or self._twice:  # refused already: the rest is only counted
            self._seen, self.kept = {}, []
            return
        line = read_line(raw, self.max_line_bytes)
        # every record's custom_id is unique, the ids given to unreadable lines (`line:N`) too
        key = hashlib.blake2b(line.custom_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        first = self._seen.setdefault(key, line.number)
        if first != line.number:
            self._twice = (
                f"custom_id {line.custom_id!r} is on line {first} and again on line {line.number}: "
                "each line needs its own custom_id"
            )
            return
        if isinstance(line, Line):
            self._runnable = True
        elif line.number == 1:
            self._first = line.message
        if self.keep is not None:
            self.kept.append(self.keep(raw, line))


def check_upload(data: bytes, max_lines: int, max_line_bytes: int) -> list[Line | BadLine]:
    """The parsed lines of an upload, or UploadRefused (`UploadCheck.finish` says when)."""
    check = UploadCheck(max_lines, max_line_bytes, keep=lambda _, line: line)
    check.feed(data)
    check.finish()
    return check.kept


@dataclass(frozen=True, slots=True)
class LineAt:
    """A runnable line of a file on disk, by where it is (read again when it runs), with a sort key for its group:
    the group's bytes, or for a long group its first GROUP_PREFIX bytes and a digest (equal groups, equal keys)."""

    number: int
    offset: int
    size: int
    group: bytes


def _group_key(group: bytes) -> bytes:
    if len(group) > GROUP_PREFIX:
        return group[:GROUP_PREFIX] + hashlib.blake2b(group, digest_size=16).digest()
    return group


class InputFile:
    """A batch's input file, open while its batch runs: indexed once (each line's number, group and place, or its
    error record), each line read again when it is sent, so memory grows with its line count, not its bytes. The
    open file keeps its lines readable if it is deleted meanwhile."""

    def __init__(self, path: Path, max_line_bytes: int, group: Callable[[Line], bytes] | None = None):
        """`group`, if given, is the key lines are grouped by instead of each line's own `group`."""
        self.max_line_bytes = max_line_bytes
        groups: dict[bytes, bytes] = {}  # equal group keys are one object: the lines of a state share it

        def line_at(raw: RawLine, line: Line | BadLine) -> LineAt | BadLine:
            if isinstance(line, BadLine):
                return line
            key = _group_key(line.group if group is None else group(line))
            return LineAt(line.number, raw.offset, len(raw.data), groups.setdefault(key, key))

        self._file = open(path, "rb")  # noqa: SIM115 -- held open while the batch runs; `close` ends it
        try:
            check = UploadCheck(1 << 62, max_line_bytes, keep=line_at)
            while block := self._file.read(READ_BYTES):
                check.feed(block)
            check.finish()
        except BaseException:
            self._file.close()
            raise
        self.lines: list[LineAt | BadLine] = check.kept

    def read(self, lines: Iterable[LineAt | BadLine]) -> list[Line | BadLine]:
        """The lines to send: each LineAt read from the file and parsed again (as it was when indexed)."""
        fd = self._file.fileno()
        return [
            line
            if isinstance(line, BadLine)
            else parse(line.number, os.pread(fd, line.size, line.offset), self.max_line_bytes)
            for line in lines
        ]

    def each(self, lines: Iterable[LineAt | BadLine], chunk: int = 128) -> Iterator[Line | BadLine]:
        """`read` of `lines` in their order, `chunk` lines read at a time: only a chunk's bytes are held."""
        it = iter(lines)
        while part := list(itertools.islice(it, chunk)):
            yield from self.read(part)

    def close(self) -> None:
        self._file.close()


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
