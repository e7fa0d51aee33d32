"""The pinned-set check (`drift_set`): a small fixed set of requests run again and again through the batch path,
each run's answers compared byte for byte with the first run's (all but `usage`, whose latency varies).

On basal an answer's bytes do not depend on what else was batched with it, so a run that differs from the first
means the model, its calibration or the engine changed — never noise. The first run of a process is the
reference (a restart takes a new one: compare two processes with `basal replay`). Exported per set:
`basal_drift_set_identical` (1: every answer byte-identical to the first run's), `basal_drift_set_changed` (how
many differ) and `basal_drift_set_runs_total`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import msgspec

from basal.batch.lines import BadLine, check_upload
from basal.batch.runner import Decide
from basal.core.engine.metrics import Metrics

log = logging.getLogger("basal")

MAX_LINE_BYTES = 64 << 20
MAX_LINES = 100_000  # a pinned set is small: it runs on every interval


def read_set(path: Path) -> list[tuple[str, bytes]]:
    """(custom_id, body) of every line of a Batch API input file or a capture; ValueError on any bad line."""
    try:
        parsed = check_upload(path.read_bytes(), MAX_LINES, MAX_LINE_BYTES)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e
    bad = [p for p in parsed if isinstance(p, BadLine)]
    if bad:
        raise ValueError(f"{path}: line {bad[0].number}: {bad[0].message}")
    if not parsed:
        raise ValueError(f"{path}: no lines")
    return [(p.custom_id, p.body) for p in parsed]  # type: ignore[union-attr]


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


class PinnedSet:
    """One pinned set: its lines, the decider that answers them (`basal.api.decide.body_decider`: the background
    lane) and the first run's answers."""

    def __init__(self, path: Path, decide: Decide, metrics: Metrics):
        self.name = path.name
        self.lines = read_set(path)
        self.decide = decide
        self.metrics = metrics
        self.reference: dict[str, tuple[int, bytes]] | None = None
        self._task: asyncio.Task | None = None

    async def _answers(self) -> dict[str, tuple[int, bytes]]:
        outs = await asyncio.gather(*(self.decide(body, lambda: False) for _, body in self.lines))
        return {cid: (status, answer_bytes(body)) for (cid, _), (status, body, _) in zip(self.lines, outs, strict=True)}

    async def check(self) -> int:
        """Run the set once; -> how many answers differ from the first run's (0 on the first run)."""
        answers = await self._answers()
        if self.reference is None:
            self.reference = answers
        changed = sum(answers.get(k) != v for k, v in self.reference.items())
        self.metrics.drift_set_runs.inc(self.name)
        self.metrics.drift_set_changed.set(self.name, value=changed)
        self.metrics.drift_set_identical.set(self.name, value=float(changed == 0))
        if changed:
            log.warning("pinned set %s: %d of %d answers differ from its first run", self.name, changed, len(answers))
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
