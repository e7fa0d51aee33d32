"""The pinned-set check (`drift_set`): a small fixed set of requests run again and again through the batch path,
each run's answers compared byte for byte with a reference run's (all but `usage`, whose latency varies).

On basal an answer's bytes do not depend on what else was batched with it, so a run that differs from the
reference means the model, its calibration or the engine changed — never noise. The reference is kept in a file
(`ReferenceFile`), so a change across a restart (new weights, a new engine) is caught too. Its key is the set
file's content and the served models its lines ask for, never the weights: telling that they changed is the
point. Deleting the file accepts a change: the next run is the new reference. Exported per set:
`basal_drift_set_identical` (1: every answer byte-identical to the reference's), `basal_drift_set_changed` (how
many differ) and `basal_drift_set_runs_total`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from basal.batch.lines import BadLine, check_upload
from basal.batch.runner import Decide
from basal.core.engine.metrics import Metrics
from basal.core.home import write_text_atomic

log = logging.getLogger("basal")

MAX_LINE_BYTES = 64 << 20
MAX_LINES = 100_000  # a pinned set is small: it runs on every interval
REFERENCE_FORMAT = 1  # the reference file's layout; a file of another is read as no reference

Answers = dict[str, tuple[int, bytes]]  # custom_id -> (status, the answer's bytes without `usage`)


def parse_set(data: bytes, where: Path) -> list[tuple[str, bytes]]:
    """(custom_id, body) of every line of a Batch API input file or a capture; ValueError on any bad line."""
    try:
        parsed = check_upload(data, MAX_LINES, MAX_LINE_BYTES)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    bad = [p for p in parsed if isinstance(p, BadLine)]
    if bad:
        raise ValueError(f"{where}: line {bad[0].number}: {bad[0].message}")
    if not parsed:
        raise ValueError(f"{where}: no lines")
    return [(p.custom_id, p.body) for p in parsed]  # type: ignore[union-attr]


def read_set(path: Path) -> list[tuple[str, bytes]]:
    """`parse_set` of the file at `path` (ValueError when it cannot be read)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: {e}") from e
    return parse_set(data, path)


def answer_bytes(body: bytes) -> bytes:
    """A response without its `usage` (which reports the run's latency): the model and every answer, their
    numbers re-encoded as the shortest text that reads back to the same bits — equal exactly when the answers are."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    if isinstance(value, dict):
        value.pop("usage", None)
    return msgspec.json.encode(value)


def asked_models(lines: list[tuple[str, bytes]], resolve: Callable[[str | None], str | None]) -> list[str]:
    """The served names the lines ask for (`resolve`: a requested name, or None for the default, to the served one;
    a name it does not know is kept as asked), sorted."""
    names = set()
    for _, body in lines:
        try:
            value = msgspec.json.decode(body)
        except msgspec.DecodeError:
            value = None
        asked = value.get("model") if isinstance(value, dict) else None
        asked = asked if isinstance(asked, str) else None
        names.add(resolve(asked) or f"{asked} (not served)")
    return sorted(names)


def reference_key(set_digest: str, models: list[str]) -> str:
    """What a reference belongs to: the set file's content and the served models it asks (a weight, a calibration
    or the engine is not in it: a change of those is what the check tells)."""
    h = hashlib.sha256()
    for part in (set_digest, *models):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


class ReferenceFile:
    """A pinned set's reference answers, one JSON file per key in `directory`, written whole or not at all. A file
    that is missing, unreadable or of another key or layout is no reference (the caller takes a new one)."""

    def __init__(self, directory: Path, set_name: str):
        self.directory = directory
        self.stem = Path(set_name).stem or "set"

    def path(self, key: str) -> Path:
        return self.directory / f"{self.stem}.{key[:16]}.reference.json"

    def load(self, key: str) -> Answers | None:
        path = self.path(key)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as e:
            log.error(
                "pinned set reference %s cannot be read (%s: %s): this run is the new reference",
                path,
                type(e).__name__,
                e,
            )
            return None
        answers = _answers_of(doc, key)
        if answers is None:
            log.error(
                "pinned set reference %s is not a reference of this set and models: this run is the new one", path
            )
        return answers

    def save(self, key: str, answers: Answers) -> Path:
        """Write `answers` as the reference of `key` (OSError when the directory cannot be written)."""
        doc = {
            "format": REFERENCE_FORMAT,
            "key": key,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # the bytes as text; a byte that is not UTF-8 round-trips as an escaped surrogate
            "answers": {
                cid: [status, body.decode("utf-8", "surrogateescape")] for cid, (status, body) in answers.items()
            },
        }
        path = self.path(key)
        write_text_atomic(path, json.dumps(doc, sort_keys=True))
        return path


def _answers_of(doc: Any, key: str) -> Answers | None:
    if not isinstance(doc, dict) or doc.get("format") != REFERENCE_FORMAT or doc.get("key") != key:
        return None
    raw = doc.get("answers")
    if not isinstance(raw, dict):
        return None
    answers: Answers = {}
    for cid, value in raw.items():
        if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int and isinstance(value[1], str)):
            return None
        answers[cid] = (value[0], value[1].encode("utf-8", "surrogateescape"))
    return answers


class PinnedSet:
    """One pinned set: its lines, the decider that answers them (`basal.api.decide.body_decider`: the background
    lane), where its reference is kept (`references`; None: in memory only, a restart takes a new one) and the
    reference answers. `resolve`: a line's requested model name (None: none given) to the served name, for the
    reference's key (`basal.core.request.model_names.ServedModels`; by default the names as asked)."""

    def __init__(
        self,
        path: Path,
        decide: Decide,
        metrics: Metrics,
        references: Path | None = None,
        resolve: Callable[[str | None], str | None] = lambda name: name or "",
    ):
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ValueError(f"{path}: {e}") from e
        self.name = path.name
        self.lines = parse_set(data, path)
        self.key = reference_key(hashlib.sha256(data).hexdigest(), asked_models(self.lines, resolve))
        self.decide = decide
        self.metrics = metrics
        self.references = ReferenceFile(references, self.name) if references is not None else None
        self.reference: Answers | None = None
        self._kept = False  # the reference is in its file (else it lives in memory only)
        self._task: asyncio.Task | None = None

    async def _answers(self) -> Answers:
        outs = await asyncio.gather(*(self.decide(body, lambda: False) for _, body in self.lines))
        return {cid: (status, answer_bytes(body)) for (cid, _), (status, body, _) in zip(self.lines, outs, strict=True)}

    async def _reference(self, answers: Answers) -> Answers:
        """The reference to compare `answers` with: the kept file's; when there is none (first run, deleted,
        unreadable) `answers` themselves, written as the new one. A directory that cannot be written keeps the
        reference in memory (logged)."""
        if self.references is None:
            return self.reference if self.reference is not None else answers
        kept = await asyncio.to_thread(self.references.load, self.key)
        if kept is not None:
            if self.reference is None:
                log.info("pinned set %s: compared with its reference %s", self.name, self.references.path(self.key))
            self._kept = True
            return kept
        if self.reference is not None and not self._kept:
            return self.reference  # the directory could not be written: the reference of this process
        try:
            path = await asyncio.to_thread(self.references.save, self.key, answers)
        except OSError as e:
            log.error("pinned set %s: its reference cannot be kept (%s): a restart takes a new one", self.name, e)
            self._kept = False
        else:
            log.info(
                "pinned set %s: this run is its reference, kept in %s (delete it to take a new one)", self.name, path
            )
            self._kept = True
        return answers

    async def check(self) -> int:
        """Run the set once; -> how many answers differ from the reference's (0 when this run is the reference)."""
        answers = await self._answers()
        self.reference = reference = await self._reference(answers)
        changed = sum(answers.get(k) != reference.get(k) for k in answers.keys() | reference.keys())
        self.metrics.drift_set_runs.inc(self.name)
        self.metrics.drift_set_changed.set(self.name, value=changed)
        self.metrics.drift_set_identical.set(self.name, value=float(changed == 0))
        if changed:
            log.warning("pinned set %s: %d of %d answers differ from its reference", self.name, changed, len(answers))
        return changed

    async def run_every(self, interval_s: float) -> None:
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failed run is logged; the next one tries again
                log.error("pinned set %s: the run failed: %s: %s", self.name, type(e).__name__, e)
            await asyncio.sleep(interval_s)

    def starter(self, interval_s: float):
        """An app start-up hook that runs the set on the server's loop every `interval_s`, and its shutdown hook."""

        async def start() -> None:
            self._task = asyncio.get_running_loop().create_task(self.run_every(interval_s))

        async def stop() -> None:
            if self._task is not None:
                self._task.cancel()

        return start, stop
