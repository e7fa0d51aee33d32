"""`basal run-batch INPUT -o OUTPUT`: a Batch API input file run without a server, into one JSONL of records.

The records are the server's (output and error records in one file, in the order lines finish; match them by
`custom_id`), each appended and synced as its chunk finishes. Re-running with the same OUTPUT skips every
`custom_id` already there, so an interrupted run resumes; a last line cut short by the interruption is dropped
first (it is run again).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from basal.batch.lines import check_upload
from basal.batch.runner import Decide, run_lines


@dataclass(frozen=True)
class Summary:
    ran: int  # lines recorded by this run
    failed: int  # of those, error records or answers other than 200
    skipped: int  # lines whose custom_id OUTPUT already held


def recorded_ids(output: Path) -> set[str]:
    """The custom_ids OUTPUT already holds; a torn last line (no LF) is cut off first."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(output, "r+b") as f:
            f.truncate(len(whole))
    ids = set()
    for number, line in enumerate(whole.splitlines(), 1):
        try:
            ids.add(msgspec.json.decode(line)["custom_id"])
        except (msgspec.DecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{output}: line {number} is not a batch record ({e}); give another -o file") from e
    return ids


def pending(source: Path, output: Path, max_line_bytes: int) -> tuple[int, int]:
    """(lines of `source` that `output` lacks, lines it already holds), read without loading a model."""
    try:
        lines = check_upload(source.read_bytes(), 1 << 62, max_line_bytes)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e
    done = recorded_ids(output)
    todo = sum(line.custom_id not in done for line in lines)
    return todo, len(lines) - todo


async def run_file(
    source: Path,
    output: Path,
    decide: Decide,
    max_line_bytes: int,
    on_record: Callable[[str, bool], None] = lambda _id, _ok: None,
    before: Callable[[int, int], None] = lambda _todo, _skipped: None,
) -> Summary:
    """Run the lines of `source` that `output` lacks, appending their records to `output`."""
    try:
        lines = check_upload(source.read_bytes(), 1 << 62, max_line_bytes)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e
    done = recorded_ids(output)
    todo = [line for line in lines if line.custom_id not in done]
    ids = {line.number: line.custom_id for line in todo}
    before(len(todo), len(lines) - len(todo))
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
                on_record(ids[number], ok)

        await run_lines(todo, decide, record)
    return Summary(counts[0], counts[1], len(lines) - len(todo))
