"""`basal run-batch INPUT -o OUTPUT`: a Batch API input file run without a server, into one JSONL of records.

The records are the server's (output and error records in one file, in the order lines finish; match them by
`custom_id`), each appended and synced as its chunk finishes. Re-running with the same OUTPUT skips every
`custom_id` already there, so an interrupted run resumes; a last line cut short by the interruption is dropped
first (it is run again).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from basal.batch.lines import READ_BYTES, BadLine, InputFile, Line, LineAt
from basal.batch.runner import Decide, in_group_order, run_lines


@dataclass(frozen=True)
class Summary:
    ran: int  # lines recorded by this run
    failed: int  # of those, error records or answers other than 200
    skipped: int  # lines whose custom_id OUTPUT already held


def recorded_ids(output: Path) -> set[str]:
    """The custom_ids OUTPUT already holds; a torn last line (no LF) is cut off first. Read a line at a time."""
    if not output.exists():
        return set()
    with open(output, "rb") as f:
        size, whole = os.fstat(f.fileno()).st_size, _whole_length(f)
    if whole != size:
        with open(output, "r+b") as f:
            f.truncate(whole)
    ids = set()
    number = 0
    with open(output, "rb") as f:
        for record in f:  # LF-ended lines; `splitlines` numbers them as the whole file's `splitlines` would
            for line in record.splitlines():
                number += 1
                try:
                    ids.add(msgspec.json.decode(line)["custom_id"])
                except (msgspec.DecodeError, KeyError, TypeError) as e:
                    raise ValueError(
                        f"{output}: line {number} is not a batch record ({e}); give another -o file"
                    ) from e
    return ids


def _whole_length(f: BinaryIO) -> int:
    """Bytes of an open file up to and including its last LF (0 if it has none), read from its end."""
    end = f.seek(0, os.SEEK_END)
    while end > 0:
        start = max(0, end - READ_BYTES)
        f.seek(start)
        at = f.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def _index(source: Path, max_line_bytes: int) -> InputFile:
    try:
        return InputFile(source, max_line_bytes)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def _todo(source: InputFile, done: set[str]) -> list[LineAt | BadLine]:
    """The lines of `source` (where they are) whose custom_id `done` lacks, read a chunk at a time."""
    if not done:
        return source.lines
    return [at for at, line in zip(source.lines, source.each(source.lines), strict=True) if line.custom_id not in done]


def pending(source: Path, output: Path, max_line_bytes: int) -> tuple[int, int]:
    """(lines of `source` that `output` lacks, lines it already holds), read without loading a model."""
    index = _index(source, max_line_bytes)
    try:
        todo = len(_todo(index, recorded_ids(output)))
    finally:
        index.close()
    return todo, len(index.lines) - todo


async def run_file(
    source: Path,
    output: Path,
    decide: Decide,
    max_line_bytes: int,
    on_record: Callable[[str, bool], None] = lambda _id, _ok: None,
    before: Callable[[int, int], None] = lambda _todo, _skipped: None,
) -> Summary:
    """Run the lines of `source` that `output` lacks, appending their records to `output`. The input is indexed
    once and its lines read again a chunk at a time as they are sent: memory grows with its line count (an index
    entry each), not with its bytes."""
    index = _index(source, max_line_bytes)
    try:
        return await _run_index(index, output, decide, on_record, before)
    finally:
        index.close()


async def _run_index(
    index: InputFile,
    output: Path,
    decide: Decide,
    on_record: Callable[[str, bool], None],
    before: Callable[[int, int], None],
) -> Summary:
    todo = _todo(index, recorded_ids(output))
    total = len(index.lines)
    before(len(todo), total - len(todo))
    ids: dict[int, str] = {}  # line number -> custom_id, of the lines sent and not yet recorded

    async def lines() -> AsyncIterator[Line | BadLine]:
        for line in index.each(in_group_order(todo)):  # the order `run_lines` gives a list of lines
            ids[line.number] = line.custom_id
            yield line

    counts = [0, 0]
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "ab") as out:

        async def record(chunk: list[tuple[int, bool, bytes]]) -> None:
            out.write(b"".join(r + b"\n" for _, _, r in chunk))
            out.flush()
            os.fsync(out.fileno())
            for number, ok, _ in chunk:
                counts[0] += 1
                counts[1] += not ok
                on_record(ids.pop(number), ok)

        await run_lines(lines(), decide, record)
    return Summary(counts[0], counts[1], total - len(todo))
