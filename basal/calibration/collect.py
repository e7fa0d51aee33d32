"""A labelled file through the serving decision path: the batch runner (`basal.batch.runner.run_lines`), lines of
one state together so the prefix tree computes the state once, every answer with its diagnostics.

What it keeps per readout is the average of the two option orders (`p_avg`, docs/contract.md §2.1) exactly as the
server computed it; the temperature is applied afterwards, by the same function the server uses. Records are
appended to a file as lines finish (the Batch API's record format), so an interrupted run resumes: a line whose
record is there is not run again. Records are filed under a hash of the request as sent, so a changed line runs
again and a record of a line no longer in the file is ignored.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from basal.batch.lines import Line
from basal.batch.offline import recorded_ids
from basal.batch.runner import Decide, run_lines
from basal.calibration.labelled import Labelled, LabelledError, LabelledLine, Readout


@dataclass(frozen=True)
class Observed:
    """One labelled readout and what the model said: `p_avg` in the readout's key order."""

    line: LabelledLine
    readout: Readout
    p_avg: np.ndarray
    served_temperature: float  # what the server applied when it ran (the calibration it served then)


def _state_group(body: bytes) -> bytes:
    value = msgspec.json.decode(body)
    return msgspec.json.encode([value.get("model"), value.get("state"), value.get("lang"), value.get("facts")])


async def run_labelled(
    labelled: Labelled,
    decide: Decide,
    records: Path,
    before: Callable[[int, int], None] = lambda _todo, _done: None,
    on_record: Callable[[str, bool], None] = lambda _key, _ok: None,
) -> list[Observed]:
    """Run every line `records` lacks (equal requests once), then read every line's answer from `records`."""
    done = recorded_ids(records)
    unique: dict[str, LabelledLine] = {}
    for line in labelled.lines:
        unique.setdefault(line.key, line)
    todo = [Line(n, key, line.body, _state_group(line.body)) for n, (key, line) in enumerate(unique.items(), 1)]
    todo = [line for line in todo if line.custom_id not in done]
    before(len(todo), len(unique) - len(todo))
    records.parent.mkdir(parents=True, exist_ok=True)
    if todo:
        with open(records, "ab") as out:

            async def record(chunk: list[tuple[int, bool, bytes]]) -> None:
                out.write(b"".join(r + b"\n" for _, _, r in chunk))
                out.flush()
                os.fsync(out.fileno())
                for n, ok, _ in chunk:
                    on_record(todo_ids[n], ok)

            todo_ids = {line.number: line.custom_id for line in todo}
            await run_lines(todo, decide, record)
    return observed(labelled, read_records(records, set(unique)))


def read_records(records: Path, wanted: set[str]) -> dict[str, tuple[int, bytes]]:
    """custom_id -> (status, response body) of the wanted records (the last one of an id wins)."""
    found: dict[str, tuple[int, bytes]] = {}
    if not records.exists():
        return found
    with open(records, "rb") as f:
        for part in f:  # a record at a time
            for raw in part.splitlines():
                rec = msgspec.json.decode(raw)
                if rec.get("custom_id") in wanted and rec.get("response") is not None:
                    response = rec["response"]
                    found[rec["custom_id"]] = (int(response["status_code"]), msgspec.json.encode(response["body"]))
    return found


def observed(labelled: Labelled, answers: dict[str, tuple[int, bytes]]) -> list[Observed]:
    """Every labelled readout with its `p_avg` from the answers' diagnostics; a line the server refused, or did not
    answer, is an error naming it."""
    out: list[Observed] = []
    problems: list[str] = []
    for line in labelled.lines:
        if line.key not in answers:
            problems.append(f"{labelled.path} line {line.number}: no answer was recorded (run again to resume)")
            continue
        status, body = answers[line.key]
        if status != 200:
            problems.append(f"{labelled.path} line {line.number}: the server answered HTTP {status}: {body[:300]!r}")
            continue
        diagnostics = msgspec.json.decode(body)["diagnostics"]["questions"]
        by_question: dict[str, list[tuple[dict[str, float], float, str]]] = {}
        for name, q in diagnostics.items():
            by_question[name] = [(r["average"], float(q["temperature"]), q["type"]) for r in q["readouts"]]
        at: dict[str, int] = {}
        for r in line.readouts:
            i = at.get(r.question, 0)
            at[r.question] = i + 1
            average, temperature, _type = by_question[r.question][i]
            out.append(Observed(line, r, np.array([average[k] for k in r.keys], dtype=np.float64), temperature))
        if len(problems) > 20:
            break
    if problems:
        raise LabelledError("\n".join(problems))
    return out
