"""The engine of one model: when and where its work runs (queues, lanes, the device gate, cancellation).

    HTTP handler --admit (thread pool when large)--> Engine.submit --> main lane | long lane (threads)
                 <--------------- future resolved from the lane thread ------------------

What a request needs and what its results mean is the pipeline's (`basal.core.engine.seam`); a lane's step is

    jobs = queue.admit(budget)                      schedule (basal.core.engine.scheduler)
    rows = forward(pack(job states))                run, under the gate; each job's rows by its state
    settle(job state, rows[job state]) per job      answer it, or queue its next round again

Each lane is a thread with its own `JobQueue`; a request over `long_tokens` packed tokens goes to the long lane.
All lanes of all models share one `Gate`, so one pass computes at a time, main lanes first. A lane packs its
pass before it takes the gate (the device waits for no host work), and every yield of the pass is a checkpoint: a
long pass steps aside there (`basal.core.engine.gate`), and a pass whose clients have all gone, or that the server
abandons at shutdown, stops there. A request whose client went away is dropped before admission.
On an asynchronous device a lane keeps two passes in flight: it lets the gate go once a pass's device work is
queued (`passes.QUEUED`), packs and queues the next one behind it, and then answers the first.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Generator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from basal.core.engine.gate import Gate, Holder
from basal.core.engine.memory import release_free_memory
from basal.core.engine.metrics import Metrics
from basal.core.engine.scheduler import Job, JobQueue, Policy
from basal.core.engine.seam import Facts, Next, Rows, Seam, Stats
from basal.core.errors import Cancelled, EngineClosed, RequestError
from basal.core.packing.passes import QUEUED, advance
from basal.core.request.limits import DEFAULT_LIMITS, Limits
from basal.core.request.plan import DecisionRequest

log = logging.getLogger(__name__)

TRIM_AFTER_CHARS = 4 << 20  # after a request this large, give freed heap memory back to the system
IDLE_POLL_S = 50e-6  # a lane with a pass in flight and none waiting: how long it sleeps between readback polls


class _PassStopped(Exception):
    """A pass stopped at a checkpoint: every client of its jobs is gone, or the server abandons its work."""


@dataclass(frozen=True)
class EngineSettings:
    max_batch_tokens: int = 8192
    schedule: Policy = Policy.HRRN
    long_tokens: int = 4096  # 0: no long lane
    limits: Limits = field(default=DEFAULT_LIMITS)


class Lane:
    """One worker thread, its queue, and how it holds the device (urgent main lane / preemptible long lane)."""

    def __init__(self, engine: Engine, name: str, urgent: bool):
        self.engine, self.name, self.urgent = engine, name, urgent
        self.queue = JobQueue(engine.settings.schedule, engine.prefix_tokens, engine.pipeline.cached_prefix)
        self.cv = threading.Condition()
        self.closing = False
        self.drain = True
        self.online = False  # an urgent lane with work: told to the gate, so that background host work waits
        self.thread = threading.Thread(target=self._serve, name=f"basal-{engine.name}-{name}", daemon=True)

    def submit(self, job: Job) -> None:
        with self.cv:
            if self.closing:
                raise EngineClosed("the server is shutting down")
            self.queue.push(job)
            self._mark_online(True)
            self.cv.notify()

    def close(self, drain: bool) -> None:
        with self.cv:
            self.closing, self.drain = True, drain
            if not self.thread.is_alive():  # never started: nothing of its will run, background work need not wait
                self._mark_online(False)
            self.cv.notify()

    def _mark_online(self, busy: bool) -> None:
        """An urgent lane tells the gate when it has work and when it has none left (the caller holds `cv`)."""
        if self.urgent and busy != self.online:
            self.online = busy
            self.engine.gate.online(busy)

    def _serve(self) -> None:
        try:
            self._loop()
        finally:  # however the lane ends, background work must not wait for it
            with self.cv:
                self._mark_online(False)

    def _loop(self) -> None:
        in_flight: _InFlight | None = None  # the last pass, queued on the device: its answers are still to come
        while True:
            with self.cv:
                while not len(self.queue) and not self.closing and in_flight is None:
                    self._mark_online(False)
                    self.cv.wait()
                if in_flight is not None and not len(self.queue) and not self.closing:
                    self.cv.wait(IDLE_POLL_S)  # between polls of its readback; a new job wakes the lane at once
                for job in self.queue.drop_cancelled():
                    self.engine.cancelled_jobs += 1
                    job.finish(Cancelled())
                if self.closing and (not len(self.queue) or not self.drain):
                    rest = self.queue.admit(1 << 62)
                    break
                jobs = self.queue.admit(self.engine.settings.max_batch_tokens) if len(self.queue) else []
            if jobs:  # packed while the last pass computes, and queued behind it
                queued = self._run(jobs, in_flight)
                if in_flight is not None:
                    self._finish(in_flight)  # unless _run finished it while it waited for the device
                in_flight = queued
            elif in_flight is not None and self._finish(in_flight, one_step=True):
                in_flight = None  # answered; until then every step looks for a next pass to queue behind it
        if in_flight is not None:
            self._finish(in_flight)
        for job in rest:
            job.finish(EngineClosed("the server shut down before this request ran"))

    def _run(self, jobs: list[Job], in_flight: _InFlight | None = None) -> _InFlight | None:
        """Pack and run a pass over `jobs`. On an asynchronous device the pass pauses once its device work is queued
        (`passes.QUEUED`): the gate is let go and the pass is returned, to be finished after the lane has packed
        and queued its next pass behind it. Otherwise it is answered here. `in_flight`, the lane's last pass,
        is finished first if the device is not free at once, so its answers never wait behind another lane."""
        engine, metrics = self.engine, self.engine.metrics
        background = jobs[0].background  # a pass holds online jobs or background jobs, never both
        while True:  # packed without the device; packed again if a client leaves while the pass waits for it
            jobs = self._drop_gone(jobs)
            if not jobs:
                return None
            try:
                # background: not while an online pass is packed, computed or answered, unless below its floor
                with engine.gate.host_work() if background else nullcontext():
                    packed = engine.pipeline.pack([job.state for job in jobs])
            except Exception as e:  # a bug: fail these jobs, keep serving
                log.exception("packing a pass of %d requests failed", len(jobs))
                self._fail(jobs, e)
                return None
            before_wait = None if in_flight is None else (lambda f=in_flight: self._finish(f))
            with engine.gate.hold(self.urgent, before_wait, background) as holder:
                if any(job.cancelled() for job in jobs):
                    continue
                started = time.perf_counter()
                for job in jobs:
                    if job.passes == 0:  # a later round re-enters: keep its first wait
                        job.queue_ms = (started - job.arrival) * 1000
                        metrics.queue_duration.observe(engine.name, self.name, value=job.queue_ms / 1000)
                    job.passes += 1
                    job.pass_requests = len(jobs)
                steps = engine.pipeline.forward(packed, preemptible=not self.urgent)
                outcome, rows = self._drive(steps, holder, jobs, pause_at_queued=True)
            break
        stats = packed.stats
        if outcome == "pending":  # paused at QUEUED
            return _InFlight(jobs, stats, steps, started)
        del packed  # a large pass's memory can go back to the system after its answers
        self._answer(jobs, stats, started, outcome, rows)
        return None

    def _finish(self, f: _InFlight, one_step: bool = False) -> bool:
        """The rest of a queued pass, without the gate (its device work is in the stream): readback, answers;
        with `one_step`, one step of it only (a poll of its readback). -> whether it is answered (once only)."""
        if f.finished:
            return True
        outcome, rows = self._drive(f.steps, _OUTSIDE_GATE, f.jobs, one_step=one_step)
        if outcome == "pending":
            return False
        f.finished = True
        self._answer(f.jobs, f.stats, f.started, outcome, rows)
        return True

    def _drive(
        self, steps, holder, jobs: list[Job], pause_at_queued: bool = False, one_step: bool = False
    ) -> tuple[str, Any]:
        """-> ("ok", each job's rows), ("pending", None) (paused at QUEUED or after one step), ("stopped", None) or
        ("error", the exception)."""
        try:
            done, rows = _drive(steps, holder, _stop_when(self.engine, jobs), pause_at_queued, one_step)
        except _PassStopped:
            return "stopped", None
        except Exception as e:  # a bug or a device failure: fail this pass, keep serving
            log.exception("a pass of %d requests failed", len(jobs))
            for job in jobs:
                job.log(log, logging.ERROR, "its pass of %d requests failed: %s: %s", len(jobs), type(e).__name__, e)
            return "error", e
        return ("ok", rows) if done else ("pending", None)

    def _answer(self, jobs: list[Job], stats: Stats, started: float, outcome: str, rows: Any) -> None:
        engine, metrics = self.engine, self.engine.metrics
        seconds = time.perf_counter() - started
        metrics.pass_duration.observe(engine.name, self.name, outcome, value=seconds)
        metrics.pass_requests.observe(engine.name, self.name, value=len(jobs))
        engine.passes += 1
        if rows is None:
            engine.stopped_passes += 1
            if engine.abandoned:
                self._fail(jobs, EngineClosed("the server shut down while this request ran"))
            else:
                engine.cancelled_jobs += len(jobs)
                self._fail(jobs, Cancelled())
            return
        if isinstance(rows, Exception):
            self._fail(jobs, rows)
            return
        self.queue.observe(stats.packed_tokens, seconds)
        engine.packed_tokens += stats.packed_tokens
        engine.prompt_tokens += stats.prompt_tokens
        metrics.packed_tokens.inc(engine.name, self.name, by=stats.packed_tokens)
        metrics.prompt_tokens.inc(engine.name, self.name, by=stats.prompt_tokens)
        for job in jobs:
            job.compute_ms += seconds * 1000
            try:
                with engine.gate.host_work() if job.background else nullcontext():
                    settled = engine.pipeline.settle(job.state, rows[job.state], job.arrival, job.cancelled)
                if isinstance(settled, Next):  # a second stage: back into this lane, ahead of most by its long wait
                    job.tokenized, job.cost = settled.tokenized, settled.cost
                    self.submit(job)
                    continue
                engine.computed_jobs += 1
                job.finish(settled)
            except (EngineClosed, RequestError) as e:
                job.finish(e)
            except Cancelled as e:  # the client left while its large choice was fitted
                engine.cancelled_jobs += 1
                job.finish(e)
            except Exception as e:
                job.log(log, logging.ERROR, "answer failed", exc_info=e)
                job.finish(e)
        if stats.prompt_tokens * 4 > TRIM_AFTER_CHARS:
            del rows
            release_free_memory()

    def _drop_gone(self, jobs: list[Job]) -> list[Job]:
        """Jobs whose client is still there; the others are answered Cancelled and never computed."""
        gone = [job for job in jobs if job.cancelled()]
        for job in gone:
            self.engine.cancelled_jobs += 1
            job.finish(Cancelled())
        return [job for job in jobs if job not in gone] if gone else jobs

    @staticmethod
    def _fail(jobs: list[Job], error: Exception) -> None:
        for job in jobs:
            job.finish(error)


@dataclass
class _InFlight:
    """A pass whose device work is queued (paused at `QUEUED`); its readback and answers are to come."""

    jobs: list[Job]
    stats: Stats
    steps: Generator[Any, None, Rows]
    started: float
    finished: bool = False


class _OutsideGate:
    """The holder of a pass finished without the gate: there is no device to offer back."""

    def checkpoint(self) -> bool:
        return False


_OUTSIDE_GATE = _OutsideGate()


def _drive(
    steps,
    holder: Holder | _OutsideGate,
    stop: Callable[[], bool] = lambda: False,
    pause_at_queued: bool = False,
    one_step: bool = False,
) -> tuple[bool, Rows | None]:
    """Run a pass to its end (-> (True, result)); with `pause_at_queued` until it yields `QUEUED`, with `one_step`
    for one step (-> (False, None) there). Every yield is a checkpoint: the pass stops there if `stop()` says so,
    and a preemptible lane offers the device back there (between layers, or inside one where the backend yields)."""
    while True:
        ended, step = advance(steps)
        if ended:
            return True, step
        if stop() or (holder.checkpoint() and stop()):
            steps.close()
            raise _PassStopped()
        if one_step or (step is QUEUED and pause_at_queued):
            return False, None


class Engine:
    """One model: its pipeline (asked through `Seam`'s four calls) and its lanes."""

    def __init__(
        self, name: str, pipeline: Seam, gate: Gate, metrics: Metrics, settings: EngineSettings = EngineSettings()
    ):
        self.name, self.pipeline, self.gate, self.metrics, self.settings = name, pipeline, gate, metrics, settings
        facts = pipeline.facts()
        self.prefix_tokens = facts.prefix_tokens  # the scheduler does not count them: computed once at load
        self.context = facts.context  # the longest prompt the model reads, in tokens
        self.prompt_char_limit = facts.prompt_char_limit(settings.limits)
        self.main = Lane(self, "main", urgent=True)
        self.long = Lane(self, "long", urgent=False) if settings.long_tokens > 0 else None
        # Batch API lines (background jobs) run on the long lane, behind its online jobs; without one, on their own
        # preemptible lane: either way they step aside for main lanes after a slice and have the long lane's floor
        self.background = Lane(self, "background", urgent=False) if self.long is None else None
        self.computed_jobs = self.cancelled_jobs = self.passes = self.stopped_passes = 0
        self.packed_tokens = self.prompt_tokens = 0  # tokens computed vs in the option-order prompts, all passes
        self.abandoned = False  # shutdown gave up on running work: passes stop at their next checkpoint

    def facts(self) -> Facts:
        """The model's facts (plain data: the front's `ModelInfo`, the metrics)."""
        return self.pipeline.facts()

    def start(self) -> None:
        for lane in self.lanes:
            if not lane.thread.is_alive() and not lane.closing:
                lane.thread.start()

    @property
    def lanes(self) -> list[Lane]:
        return [self.main] + [lane for lane in (self.long, self.background) if lane is not None]

    def admit(
        self,
        request: DecisionRequest,
        finish: Callable[[Any], None],
        cancelled: Callable[[], bool],
        background: bool = False,
    ) -> Job:
        """The pipeline's admission (limits, tokenize, cost: in the admission pool when large, off the event loop),
        as a job for a lane. Characters are checked before anything is tokenized, so a request over a limit costs
        little."""
        arrival = time.perf_counter()
        admitted = self.pipeline.admit(request, self.settings.limits, cancelled)
        self.metrics.tokenization_duration.observe(self.name, value=time.perf_counter() - arrival)
        job = Job(
            request,
            admitted.tokenized,
            admitted.cost,
            finish,
            cancelled,
            arrival,
            state=admitted.state,
            background=background,
        )
        job.context = contextvars.copy_context()  # the request's id for the lines a lane logs about it
        return job

    def submit(self, job: Job) -> None:
        """Queue an admitted job; one that needs no model (every question has one option) is settled at once."""
        if not job.tokenized:  # no prompt to run: settled with no rows
            job.finish(self.pipeline.settle(job.state, [], job.arrival))
            return
        if job.background:
            lane = self.long or self.background
        else:
            lane = self.long if self.long and job.cost > self.settings.long_tokens else self.main
        assert lane is not None  # the engine has a long lane or else a background lane
        lane.submit(job)

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        """Stop the lanes: finish what is queued (drain) or fail it; `abandon` also stops running passes."""
        self.abandoned = self.abandoned or abandon
        for lane in self.lanes:
            lane.close(drain)
        deadline = time.monotonic() + timeout
        for lane in self.lanes:
            if lane.thread.is_alive():
                lane.thread.join(max(0.0, deadline - time.monotonic()))


def _stop_when(engine: Engine, jobs: list[Job]) -> Callable[[], bool]:
    """When a running pass stops: the server abandons its work, or no client of its jobs is left."""
    return lambda: engine.abandoned or all(job.cancelled() for job in jobs)
