"""A labelled file: one decision request per line, each question with its `gold` answer, optional `id` and `group`.

    {"id": "t-17", "group": "customer-17", "model": "jev-latest", "state": "...",
     "questions": {"urgent": {"type": "noul", "instructions": "...", "gold": true},
                   "team": {"type": "choice", "criteria": {...}, "gold": "billing"}}}

Every line is checked with the serving parser of its dialect (so a line is refused exactly where the server would
refuse it) and every gold against the options that parser planned, before anything runs. Problems are collected
(up to `MAX_PROBLEMS`) and raised together, each naming its line.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from basal.core.errors import RequestError
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.plan import DecisionRequest

FITTED_TYPES = ("choice", "noul", "score")  # the calibration keys of CALIBRATION.json
LINE_KEYS = ("id", "group")  # what a labelled line adds to a request (and `gold` per question)
MAX_PROBLEMS = 20
DIALECTS = ("systemone", "basal")


class LabelledError(ValueError):
    """A labelled file that cannot be used; the message names each line at fault."""


@dataclass(frozen=True)
class Readout:
    """One distribution the model gives for a labelled question: the question, or one label of a multi."""

    line: int  # 1-based line of the file
    question: str  # the question's name
    label: str | None  # a multi: the label this yes/no readout is about
    type: str  # calibration key: choice | noul | score
    keys: tuple[str, ...]  # options in request order
    gold: int  # index of the gold answer in `keys`


@dataclass(frozen=True)
class LabelledLine:
    number: int
    id: str  # the line's `id`, else "line:N"
    group: str  # the line's `group`, else its id: lines of one group stay on one side of every split
    body: bytes  # the request as the server reads it: `gold`, `id` and `group` removed, `model` the served name
    readouts: tuple[Readout, ...]  # in the order the server's diagnostics list them

    @property
    def key(self) -> str:
        """What a run's record is filed under: the body's hash (equal bodies run once)."""
        return hashlib.sha256(self.body).hexdigest()[:32]


@dataclass(frozen=True)
class Labelled:
    path: Path
    dialect: str
    sha256: str  # of the file's bytes
    lines: tuple[LabelledLine, ...]

    @property
    def readouts(self) -> list[tuple[LabelledLine, Readout]]:
        return [(line, r) for line in self.lines for r in line.readouts]

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.type for _, r in self.readouts).items()))


def read_labelled(path: Path, dialect: str, model: str) -> Labelled:
    """Read and check `path`; every request is re-addressed to `model` (the served name being calibrated)."""
    if dialect not in DIALECTS:
        raise LabelledError(f"dialect must be one of {', '.join(DIALECTS)}, not {dialect!r}")
    parse = _parser(dialect, model)
    problems: list[str] = []
    lines: list[LabelledLine] = []
    seen: dict[str, int] = {}
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(_lines(f, digest), 1):
                if _read(number, raw, path, parse, dialect, model, lines, seen, problems):
                    break
    except OSError as e:
        raise LabelledError(f"{path}: cannot be read ({e.strerror or e})") from e
    if problems:
        raise LabelledError("\n".join(problems))
    if not lines:
        raise LabelledError(f"{path}: no labelled requests (one JSON request per line, each question with gold)")
    return Labelled(path, dialect, digest.hexdigest(), tuple(lines))


def _lines(f: BinaryIO, digest: Any) -> Iterator[bytes]:
    """The file's lines as `bytes.splitlines` of the whole file gives them, read an LF-ended line at a time (a CR
    LF never spans two), each hashed into `digest` as it is read."""
    for part in f:
        digest.update(part)
        yield from part.splitlines()


def _read(
    number: int,
    raw: bytes,
    path: Path,
    parse: Callable[[Any], DecisionRequest],
    dialect: str,
    model: str,
    lines: list[LabelledLine],
    seen: dict[str, int],
    problems: list[str],
) -> bool:
    """Check one line into `lines` (or its problem into `problems`) -> whether to stop: too many problems."""
    if not raw.strip():
        return False
    try:
        line = _line(number, raw, parse, dialect, model)
    except _Problem as e:
        problems.append(f"{path} line {number}: {e}")
    else:
        if line.id in seen:
            problems.append(f"{path} line {number}: id {line.id!r} is also on line {seen[line.id]}")
        seen.setdefault(line.id, number)
        lines.append(line)
    if len(problems) >= MAX_PROBLEMS:
        problems.append("(stopped after this many problems)")
        return True
    return False


class _Problem(Exception):
    pass


def _parser(dialect: str, model: str) -> Callable[[Any], DecisionRequest]:
    def resolve(_requested: str | None) -> str:
        return model

    return (
        (lambda raw: parse_systemone(raw, resolve))
        if dialect == "systemone"
        else (lambda raw: parse_basal(raw, resolve))
    )


def _line(number: int, raw: bytes, parse: Callable[[Any], DecisionRequest], dialect: str, model: str) -> LabelledLine:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise _Problem(f"not JSON ({e})") from e
    if not isinstance(value, dict):
        raise _Problem("a line must be a JSON object: one request")
    line_id, group = value.pop("id", None), value.pop("group", None)
    for name, v in (("id", line_id), ("group", group)):
        if v is not None and not (isinstance(v, str) and v) and not (isinstance(v, int) and not isinstance(v, bool)):
            raise _Problem(f"{name} must be a non-empty string or an integer")
    questions = value.get("questions")
    if not isinstance(questions, dict) or not questions:
        raise _Problem('no "questions" object')
    golds: dict[str, Any] = {}
    for name, q in questions.items():
        if not isinstance(q, dict) or "gold" not in q:
            raise _Problem(f"question {name!r} has no gold answer")
        golds[name] = q.pop("gold")
    value["model"] = model
    try:
        plan = parse(value)
    except RequestError as e:
        shown = msgspec.json.encode(e.body).decode()[:400]
        raise _Problem(f"not a /v1/{dialect} request the server would answer (HTTP {e.status}: {shown})") from e
    readouts: list[Readout] = []
    for q in plan.questions:
        gold = golds[q.name]
        if q.kind == "multi":
            labels = q.spec.keys if q.spec is not None else ()  # type: ignore[union-attr]
            chosen = _multi_gold(q.name, gold, labels)
            for label, item in zip(labels, q.branches, strict=True):
                readouts.append(Readout(number, q.name, label, "noul", item.keys, 0 if label in chosen else 1))
            continue
        if q.item.type not in FITTED_TYPES:
            raise _Problem(
                f"question {q.name!r}: type {q.item.type!r} has no temperature to fit ({', '.join(FITTED_TYPES)})"
            )
        keys = q.item.keys
        index = _gold_index(q.name, gold, keys)
        if len(keys) >= 2:  # a single option is answered with p = 1: nothing to learn from it
            readouts.append(Readout(number, q.name, None, q.item.type, keys, index))
    shown_id = str(line_id) if line_id is not None else f"line:{number}"
    return LabelledLine(
        number,
        shown_id,
        str(group) if group is not None else shown_id,
        msgspec.json.encode(value),
        tuple(readouts),
    )


def _gold_index(name: str, gold: Any, keys: tuple[str, ...]) -> int:
    """A gold answer as one of the planned keys: a key, a yes/no as a boolean, a score level as its index."""
    if isinstance(gold, bool):
        gold = "true" if gold else "false"
    elif isinstance(gold, int):
        gold = str(gold)
    if isinstance(gold, str) and gold in keys:
        return keys.index(gold)
    shown = ", ".join(repr(k) for k in keys[:12]) + (" ..." if len(keys) > 12 else "")
    raise _Problem(f"question {name!r}: gold {gold!r} is not among its options ({shown})")


def _multi_gold(name: str, gold: Any, labels: tuple[str, ...]) -> set[str]:
    if not isinstance(gold, list) or not all(isinstance(g, str) for g in gold):
        raise _Problem(f"question {name!r}: a multi's gold is the list of its labels that apply")
    unknown = [g for g in gold if g not in labels]
    if unknown:
        raise _Problem(f"question {name!r}: gold labels {unknown!r} are not among its labels {list(labels)!r}")
    return set(gold)
