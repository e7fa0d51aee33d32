"""`basal export`: run a request file and write its records (format: `basal.export.format`).

Input lines (JSONL) are requests — ``{"id", "request", "dialect"?}`` as in the golden request files, the dialect
``basal`` (upstream) unless the line or ``--dialect`` says ``systemone``; any model name in a request, ``"MODEL"``
included, means the exported model — or bench items (``state``, ``question``, ``options``, ``type``).

Every request is validated and tokenized by the server's own admission path (`Engine.admit`). Batching modes:

* ``single``: each question in a forward of its own (its option orders packed together, as upstream packs);
* ``batch``: requests go through the engine concurrently, ``BATCH_WINDOW`` at a time, as a server runs them;
* ``tree``: the questions of up to ``TREE_CHUNK`` requests at a time packed into one tree pass.

A question's logits are meant to be the same bits in all three; `basal compare` checks that they are.
The output is appended record by record; an interrupted export continues where it stopped when run again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.decision.distribution import Distribution
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.engine.rounds import Rounds
from basal.core.engine.seam import Answer, Next
from basal.core.errors import RequestError
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import MAX_OPTIONS, Item, lang_of
from basal.core.packing.backend import Backend
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import ItemLogits, TokenizedQuestion
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.plan import DecisionRequest, Dialect, Question
from basal.export.format import (
    ExportFileError,
    encode_line,
    is_manifest_line,
    item_fields,
    question_item,
    without_latency,
)
from basal.export.manifest import without_date

Batching = Literal["single", "batch", "tree"]
BATCHINGS: tuple[Batching, ...] = ("single", "batch", "tree")
BATCH_WINDOW = 64  # requests in flight at once in `batch` mode (well under the engine's in-flight limit)
TREE_CHUNK = 256  # requests whose questions share one tree pass in `tree` mode (bounds memory, allows resuming)
BENCH_FIELDS = ("index", "source", "line", "id", "type", "state", "question", "options", "gold")

# ---------------------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class ExportInput:
    line: int
    key: str  # the record id written to the export
    raw: dict[str, Any]
    dialect: Dialect | None  # None: a bench item


def read_inputs(path: Path, dialect: Dialect = "basal") -> list[ExportInput]:
    """Every input line, checked before any work starts (a bad line is an error that names it)."""
    out: list[ExportInput] = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError as e:
        raise ExportFileError(f"{path}: no such request file") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise ExportFileError(f"{path}:{n}: not valid JSON ({e.msg})") from e
        if not out and not seen and is_manifest_line(raw):
            continue  # a basal export as the request file: its inputs are run again
        if not isinstance(raw, dict) or is_manifest_line(raw):
            raise ExportFileError(f"{path}:{n}: expected a request or bench item (a JSON object)")
        if "request" in raw:
            kind = raw.get("dialect", dialect)
            if kind not in ("basal", "systemone"):
                raise ExportFileError(f'{path}:{n}: dialect must be "basal" or "systemone", not {kind!r}')
        elif {"state", "question", "options"} <= raw.keys():
            kind = None
        else:
            raise ExportFileError(
                f'{path}:{n}: neither a request ({{"id", "request"}}) nor a bench item ({{"state", "question", '
                '"options"}})'
            )
        key = (
            str(raw["id"])
            if raw.get("id") is not None
            else (f"#{raw['index']}" if raw.get("index") is not None else f"line-{n}")
        )
        if key in seen:
            raise ExportFileError(f"{path}:{n}: id {key!r} appears twice (first on line {seen[key]})")
        seen[key] = n
        out.append(ExportInput(n, key, raw, kind))
    return out


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Admission: input -> validated, tokenized request (or its error)


@dataclass
class Admitted:
    """One input on its way: the validated request and its rounds, or its error; every round run so far."""

    input: ExportInput
    request: DecisionRequest | None = None
    rounds: Rounds | None = None
    error: dict[str, Any] | None = None
    ran: list[RoundRun] = field(default_factory=list)
    answer: SystemOneResponse | BasalResponse | None = None  # once every round has run

    @property
    def running(self) -> bool:
        return self.error is None and self.rounds is not None and not self.rounds.done


@dataclass(frozen=True)
class RoundRun:
    """What one round asked (items, their token ids) and the letter logits it got back."""

    round: int
    items: list[Item]
    tokenized: list[TokenizedQuestion]
    logits: list[list[np.ndarray]]


def _error(e: RequestError) -> dict[str, Any]:
    out: dict[str, Any] = {"status": e.status, "body": e.body}
    if e.upstream is not None:
        out["upstream"] = e.upstream
    return out


def _bench_request(raw: dict[str, Any], model: str) -> DecisionRequest:
    """A bench item as a one-question request (canonical option order; keys are the option indices)."""
    options, state, question = raw["options"], raw["state"], raw["question"]
    if not (isinstance(state, str) and isinstance(question, str)):
        raise RequestError(422, {"error": "a bench item's state and question must be strings"})
    if not (isinstance(options, list) and all(isinstance(o, str) for o in options)):
        raise RequestError(422, {"error": "a bench item's options must be a list of strings"})
    if not 2 <= len(options) <= MAX_OPTIONS:
        raise RequestError(422, {"error": f"{len(options)} options (supported: 2..{MAX_OPTIONS})"})
    qtype = str(raw.get("type") or "choice")
    keys = tuple(str(i) for i in range(len(options)))
    item = Item(str(raw.get("id")), qtype, keys, tuple(options), lang_of(state + question), state, question)
    return DecisionRequest("basal", model, (Question("choice", item),))


class _RecordingPipeline(Pipeline):
    """A pipeline that keeps every round the engine runs of a request (for `batch` mode)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rounds_of: dict[int, list[RoundRun]] = {}

    def settle(
        self,
        state: Rounds,
        rows: Sequence[ItemLogits],
        arrival: float,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Answer | Next:
        if not state.done:
            run = RoundRun(state.round, list(state.asked), list(state.tokenized), list(rows))
            self.rounds_of.setdefault(id(state.request), []).append(run)
        return super().settle(state, rows, arrival, cancelled)


# ---------------------------------------------------------------------------------------------------------------
# The exporter


class Exporter:
    """Runs inputs with one model and backend in one batching mode and builds their records, in input order.

    A request runs as rounds (`basal.core.engine.rounds`): one for ordinary questions, a second for the finalists of
    a choice with 11..255 options. Every item of every round becomes an entry of the record's ``items``."""

    def __init__(
        self,
        model: ModelDir,
        backend: Backend,
        batching: Batching,
        prefix_cache: bool = True,
        state_cache_mb: float = 0,
    ):
        if batching not in BATCHINGS:
            raise ValueError(f"unknown batching {batching!r}; choose {', '.join(BATCHINGS)}")
        self.model, self.batching = model, batching
        self.pipeline = (_RecordingPipeline if batching == "batch" else Pipeline)(
            model, backend, prefix_cache=prefix_cache, state_cache_mb=state_cache_mb
        )
        self.metrics = Metrics()
        self.engine = Engine(model.name, self.pipeline, Gate(), self.metrics)

    def resolve(self, _requested: str | None) -> str:
        return self.model.name

    def serves_evidence(self, _model: str) -> bool:
        return self.pipeline.serves_evidence

    def admit(self, inp: ExportInput) -> Admitted:
        try:
            if inp.dialect is None:
                request = _bench_request(inp.raw, self.model.name)
            elif inp.dialect == "systemone":
                request = parse_systemone(inp.raw["request"], self.resolve, serves_evidence=self.serves_evidence)
            else:
                request = parse_basal(inp.raw["request"], self.resolve, serves_evidence=self.serves_evidence)
            job = self.engine.admit(request, lambda _result: None, lambda: False)
        except RequestError as e:
            return Admitted(inp, error=_error(e))
        return Admitted(inp, request, job.state)

    def records(self, inputs: Sequence[ExportInput]) -> Iterator[dict[str, Any]]:
        if self.batching == "single":
            for inp in inputs:
                yield from self._computed([self.admit(inp)], together=False)
        elif self.batching == "tree":
            for start in range(0, len(inputs), TREE_CHUNK):
                yield from self._computed([self.admit(i) for i in inputs[start : start + TREE_CHUNK]], together=True)
        else:
            engines = Engines({self.model.name: self.engine}, self.model.name, self.metrics)
            engines.start()
            try:
                for start in range(0, len(inputs), BATCH_WINDOW):
                    yield from asyncio.run(self._served(engines, inputs[start : start + BATCH_WINDOW]))
            finally:
                engines.close()

    # -- single and tree: the rounds run here ---------------------------------------------------------------

    def _computed(self, planned: list[Admitted], together: bool) -> Iterator[dict[str, Any]]:
        """Run every round of `planned`: each item alone, or all of a round's items in one tree pass."""
        while active := [p for p in planned if p.running]:
            if together:
                tokenized = [t for p in active for t in p.rounds.tokenized]
                flat = iter(run_to_end(self.pipeline.letter_logits(tokenized)))
                logits = [[next(flat) for _ in p.rounds.tokenized] for p in active]
            else:
                logits = [[run_to_end(self.pipeline.letter_logits([t]))[0] for t in p.rounds.tokenized] for p in active]
            for p, lg in zip(active, logits, strict=True):
                rounds = p.rounds
                p.ran.append(RoundRun(rounds.round, list(rounds.asked), list(rounds.tokenized), lg))
                self._settle(p, lg)
        for p in planned:
            if p.error is None and p.answer is None:  # no question needed the model
                self._settle(p, [])
            answer = None if p.answer is None else msgspec.to_builtins(p.answer)
            yield self._record(p, answer)

    def _settle(self, p: Admitted, rows: Sequence[ItemLogits]) -> None:
        """Hand a round's logits back as the engine does: the answer, or the next round (length-checked)."""
        try:
            settled = self.pipeline.settle(p.rounds, rows, time.perf_counter())
        except RequestError as e:
            p.error = _error(e)
            return
        if isinstance(settled, Answer):
            p.answer = settled.response

    # -- batch: the engine runs the rounds ------------------------------------------------------------------

    async def _served(self, engines: Engines, inputs: Sequence[ExportInput]) -> list[dict[str, Any]]:
        """Every input of the window submitted at once, as concurrent clients would; records in input order."""

        async def one(inp: ExportInput) -> dict[str, Any]:
            p = self.admit(inp)  # validation and the error record; the engine admits it again, as a server does
            if p.error is not None:
                return self._record(p, None)
            try:
                result = await engines.run(p.request)
            except RequestError as e:  # an admission limit of the engine beyond what plan() checks
                p.error = _error(e)
            p.ran = self.pipeline.rounds_of.pop(id(p.request), [])  # type: ignore[attr-defined]
            return self._record(p, None if p.error else msgspec.to_builtins(result.response))

        return list(await asyncio.gather(*(one(i) for i in inputs)))

    # -- records ---------------------------------------------------------------------------------------------

    def _items(self, p: Admitted) -> list[tuple[Item, dict[str, Any], Distribution, int]]:
        out = []
        for run in p.ran:
            for item, tokenized, logits in zip(run.items, run.tokenized, run.logits, strict=True):
                k = len(item.options)
                fields, dist = item_fields(
                    item,
                    self.model.bos,
                    tokenized.prompts,
                    self.pipeline.letter_ids[:k],
                    logits,
                    self.model.calibration.temperature(item.type),
                )
                out.append((item, fields, dist, run.round))
        return out

    def _record(self, p: Admitted, answer: dict[str, Any] | None) -> dict[str, Any]:
        raw = p.input.raw
        if p.input.dialect is None:
            record = {k: raw[k] for k in BENCH_FIELDS if k in raw}
            record["id"] = raw.get("id") if ("id" in raw or "index" in raw) else p.input.key
            if p.error is not None:
                return {**record, "error": p.error}
            ((item, fields, dist, _round),) = self._items(p)
            return {
                **record,
                "lang": item.lang,
                "orders": fields["orders"],
                "pack": fields["pack"],
                "p_avg": fields["p_avg"],
                "argmax_avg": int(np.argmax(dist.p_avg)),
                "temperature": fields["temperature"],
                "p_cal": fields["p_cal"],
                "argmax_cal": dist.argmax,
            }
        record = {"id": p.input.key}
        if "source" in raw:
            record["source"] = raw["source"]
        record |= {"dialect": p.input.dialect, "request": raw["request"]}
        if p.error is not None:
            return {**record, "items": [], "error": p.error}
        items = []
        for item, fields, _dist, round_ in self._items(p):
            entry = question_item(item, fields)
            if round_:  # a later round (a large choice's finalists); first-round items look like upstream's
                entry["round"] = round_
            items.append(entry)
        return {**record, "items": items, "answer": without_latency(answer)}


# ---------------------------------------------------------------------------------------------------------------
# Writing, and resuming an interrupted export


def _done_records(out: Path, manifest: dict[str, Any], inputs: Sequence[ExportInput]) -> int:
    """Records already in `out` from an interrupted run of the same export; a cut-off last line is dropped."""
    data = out.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # everything up to the last full line
    lines = complete.decode("utf-8").splitlines()
    try:
        head = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        head = None
    if not is_manifest_line(head):
        raise ExportFileError(f"{out} exists and is not a basal export; delete it or pass another -o")
    old = without_date(head["manifest"])
    new = without_date(manifest)
    if old != new:
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise ExportFileError(
            f"{out} holds an export made with other settings ({', '.join(changed)} differ); delete it, pass "
            "another -o, or --overwrite"
        )
    done = [json.loads(line) for line in lines[1:] if line.strip()]
    for n, (record, inp) in enumerate(zip(done, inputs, strict=False)):
        if str(record.get("id")) != inp.key and not (record.get("id") is None and inp.key.startswith("#")):
            raise ExportFileError(f"{out}: record {n + 1} is {record.get('id')!r}, the request file has {inp.key!r}")
    if len(done) > len(inputs):
        raise ExportFileError(f"{out} holds more records than the request file has requests")
    if len(complete) != len(data):
        with open(out, "r+b") as f:
            f.truncate(len(complete))
    return len(done)


def write_export(
    exporter: Exporter,
    inputs: Sequence[ExportInput],
    out: Path,
    manifest: dict[str, Any],
    overwrite: bool = False,
    on_record: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Write (or finish) the export at `out`. -> (records already there, records written now).

    `on_record(n)` is called after every record with the number of records in the file."""
    done = 0
    if out.exists() and out.stat().st_size and not overwrite:
        done = _done_records(out, manifest, inputs)
    mode = "a" if done else "w"
    with open(out, mode, encoding="utf-8") as f:
        if not done:
            f.write(encode_line({"manifest": manifest}))
            f.flush()
        for n, record in enumerate(exporter.records(inputs[done:]), done + 1):
            f.write(encode_line(record))
            f.flush()
            if on_record is not None:
                on_record(n)
    return done, len(inputs) - done
