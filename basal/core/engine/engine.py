"""The engine of one model, and the process that holds several.

    HTTP handler --plan (thread pool: tokenize, cost)--> Engine.submit --> main lane | long lane (threads)
                 <--------------- future resolved from the lane thread ------------------

Each lane is a thread with its own `JobQueue`; a request over `long_tokens` packed tokens goes to the long lane.
All lanes of all models share one `Gate`, so one batch computes at a time, main lanes first. A lane packs its
batch before it takes the gate (the device waits for no host work), and every yield of the backend is a
checkpoint: a long pass steps aside there (`basal.core.engine.gate`), and a pass whose clients have all gone, or that
the server abandons at shutdown, stops there. A request whose client went away is dropped before admission.
On an asynchronous device a lane keeps two batches in flight: it lets the gate go once a batch's device work is
queued (`overlap.QUEUED`), packs and queues the next one behind it, and then answers the first.
Request limits (`basal.core.request.limits`) are checked by counting characters before tokenizing and packed tokens
while tokenizing, so a request over them costs little.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from basal.core.decision.large_choice import is_large, prompt_count
from basal.core.engine.admission import context_length_error
from basal.core.engine.gate import Gate, Holder
from basal.core.engine.memory import release_free_memory
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.engine.scheduler import Job, JobQueue, Policy
from basal.core.errors import RequestError
from basal.core.model.model_dir import Calibration
from basal.core.model.prompt import Item
from basal.core.packing.passes import QUEUED
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.dialects import BasalResponse, DecisionRequest, Question, SystemOneResponse
from basal.core.request.limits import DEFAULT_LIMITS, Limits

log = logging.getLogger(__name__)

INLINE_PLAN_CHARS = 8192  # requests this small are tokenized on the event loop; larger ones in the planning pool
TRIM_AFTER_CHARS = 4 << 20  # after a request this large, give freed heap memory back to the system
IDLE_POLL_S = 50e-6  # a lane with a batch in flight and none waiting: how long it sleeps between readback polls


class Overloaded(Exception):
    """More than `max_inflight` requests are waiting or running (HTTP 529)."""


class EngineClosed(Exception):
    """The server is shutting down (HTTP 503)."""


class Cancelled(Exception):
    """The client went away; its request was not computed (or its pass stopped at the next checkpoint)."""


class _PassStopped(Exception):
    """A pass stopped at a checkpoint: every client of the batch is gone, or the server abandons its work."""


@dataclass(frozen=True)
class Result:
    response: SystemOneResponse | BasalResponse
    queue_ms: float
    compute_ms: float
    batch_requests: int
    replica: str = ""  # the replica that answered, when scaled out (basal.deploy); "" in one process


@dataclass(frozen=True)
class ModelInfo:
    """One served model as the HTTP layer sees it, whichever front serves it: what `/v1/models` tells and what the
    request parsers check. Plain data, so that a Ray replica can send it to the front."""

    name: str
    calibration: Calibration
    serves_evidence: bool  # an evidence head, and a backend that reads hidden states
    compute: dict[str, object]  # `Backend.describe()`: what decides the bits of this model's answers


class EnginesFront(Protocol):
    """What the HTTP layer needs of the engines behind it: served names, model facts, admission, answers, and the
    process's state. `Engines` (one process) and `basal.deploy.ingress.RayEngines` (Ray Serve) implement it; the
    HTTP layer never reaches past it."""

    default: str
    metrics: Metrics
    max_inflight: int
    closed: bool
    draining: bool

    @property
    def names(self) -> list[str]:
        """Served model names, in configuration order."""
        ...

    @property
    def inflight(self) -> int:
        """Requests holding a `slot()` now."""
        ...

    def model_info(self, name: str) -> ModelInfo:
        """The facts of one served model (a name from `names`)."""
        ...

    def slot(self) -> AbstractContextManager[None]:
        """One of `max_inflight` places; raises Overloaded (529) or EngineClosed (503) at once."""
        ...

    def begin_drain(self) -> None:
        """Shutdown has begun: refuse new requests (503), let /health say "draining", finish what runs."""
        ...

    def ready(self) -> bool:
        """Every model can answer."""
        ...

    def start(self) -> None:
        """Start what computes (the lanes); called once the app starts."""
        ...

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        """Stop taking requests; finish (drain) or fail what is queued."""
        ...

    async def run(
        self, request: DecisionRequest, cancelled: Callable[[], bool] = lambda: False, *, has_slot: bool = False
    ) -> Result:
        """Answer one validated request. Raises Overloaded, EngineClosed, Cancelled, RequestError."""
        ...


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
        self.queue = JobQueue(engine.settings.schedule, {k: len(v) for k, v in engine.pipeline.prefixes.items()})
        self.cv = threading.Condition()
        self.closing = False
        self.drain = True
        self.thread = threading.Thread(target=self._loop, name=f"basal-{engine.name}-{name}", daemon=True)

    def submit(self, job: Job) -> None:
        with self.cv:
            if self.closing:
                raise EngineClosed("the server is shutting down")
            self.queue.push(job)
            self.cv.notify()

    def close(self, drain: bool) -> None:
        with self.cv:
            self.closing, self.drain = True, drain
            self.cv.notify()

    def _loop(self) -> None:
        in_flight: _InFlight | None = None  # the last batch, queued on the device: its answers are still to come
        while True:
            with self.cv:
                while not len(self.queue) and not self.closing and in_flight is None:
                    self.cv.wait()
                if in_flight is not None and not len(self.queue) and not self.closing:
                    self.cv.wait(IDLE_POLL_S)  # between polls of its readback; a new job wakes the lane at once
                for job in self.queue.drop_cancelled():
                    self.engine.cancelled_jobs += 1
                    job.finish(Cancelled())
                if self.closing and (not len(self.queue) or not self.drain):
                    rest = self.queue.admit(1 << 62)
                    break
                batch = self.queue.admit(self.engine.settings.max_batch_tokens) if len(self.queue) else []
            if batch:  # packed while the last batch computes, and queued behind it
                queued = self._run(batch, in_flight)
                if in_flight is not None:
                    self._finish(in_flight)  # unless _run finished it while it waited for the device
                in_flight = queued
            elif in_flight is not None and self._finish(in_flight, one_step=True):
                in_flight = None  # answered; until then every step looks for a next batch to queue behind it
        if in_flight is not None:
            self._finish(in_flight)
        for job in rest:
            job.finish(EngineClosed("the server shut down before this request ran"))

    def _run(self, batch: list[Job], in_flight: _InFlight | None = None) -> _InFlight | None:
        """Pack and run a batch. On an asynchronous device the pass pauses once its device work is queued
        (`overlap.QUEUED`): the gate is let go and the batch is returned, to be finished after the lane has packed
        and queued its next batch behind it. Otherwise it is answered here. `in_flight`, the lane's last batch,
        is finished first if the device is not free at once, so its answers never wait behind another lane."""
        engine, metrics = self.engine, self.engine.metrics
        while True:  # packed without the device; packed again if a client leaves while the batch waits for it
            batch = self._drop_gone(batch)
            if not batch:
                return None
            stats = Stats()
            tokenized = [t for job in batch for t in job.tokenized]
            try:
                forwards = engine.pipeline.pack(tokenized, stats)
            except Exception as e:  # a bug: fail this batch, keep serving
                log.exception("packing a batch of %d requests failed", len(batch))
                self._fail(batch, e)
                return None
            before_wait = None if in_flight is None else (lambda f=in_flight: self._finish(f))
            with engine.gate.hold(self.urgent, before_wait) as holder:
                if any(job.cancelled() for job in batch):
                    continue
                started = time.perf_counter()
                for job in batch:
                    if job.rounds is None or job.rounds.round == 0:  # a later round re-enters: keep its first wait
                        job.queue_ms = (started - job.arrival) * 1000
                        metrics.queue_duration.observe(engine.name, self.name, value=job.queue_ms / 1000)
                    job.batch_requests = len(batch)
                steps = engine.pipeline.forward(tokenized, forwards, stats, preemptible=not self.urgent)
                outcome, logits = self._drive(steps, holder, batch, pause_at_queued=True)
            break
        if outcome == "pending":  # paused at QUEUED
            return _InFlight(batch, stats, steps, started)
        del tokenized, forwards  # a large batch's memory can go back to the system after its answers
        self._answer(batch, stats, started, outcome, logits)
        return None

    def _finish(self, f: _InFlight, one_step: bool = False) -> bool:
        """The rest of a queued batch, without the gate (its device work is in the stream): readback, answers;
        with `one_step`, one step of it only (a poll of its readback). -> whether it is answered (once only)."""
        if f.finished:
            return True
        outcome, logits = self._drive(f.steps, _OUTSIDE_GATE, f.batch, one_step=one_step)
        if outcome == "pending":
            return False
        f.finished = True
        self._answer(f.batch, f.stats, f.started, outcome, logits)
        return True

    def _drive(
        self, steps, holder, batch: list[Job], pause_at_queued: bool = False, one_step: bool = False
    ) -> tuple[str, Any]:
        """-> ("ok", logits), ("pending", None) (paused at QUEUED or after one step), ("stopped", None) or
        ("error", the exception)."""
        try:
            done, logits = _drive(steps, holder, _stop_when(self.engine, batch), pause_at_queued, one_step)
        except _PassStopped:
            return "stopped", None
        except Exception as e:  # a bug or a device failure: fail this batch, keep serving
            log.exception("batch of %d requests failed", len(batch))
            return "error", e
        return ("ok", logits) if done else ("pending", None)

    def _answer(self, batch: list[Job], stats: Stats, started: float, outcome: str, logits: Any) -> None:
        engine, metrics = self.engine, self.engine.metrics
        seconds = time.perf_counter() - started
        metrics.batch_duration.observe(engine.name, self.name, outcome, value=seconds)
        metrics.batch_requests.observe(engine.name, self.name, value=len(batch))
        engine.batches += 1
        if logits is None:
            engine.stopped_batches += 1
            if engine.abandoned:
                self._fail(batch, EngineClosed("the server shut down while this request ran"))
            else:
                engine.cancelled_jobs += len(batch)
                self._fail(batch, Cancelled())
            return
        if isinstance(logits, Exception):
            self._fail(batch, logits)
            return
        self.queue.observe(stats.packed_tokens, seconds)
        engine.packed_tokens += stats.packed_tokens
        engine.prompt_tokens += stats.prompt_tokens
        rows = iter(logits)
        for job in batch:
            job.compute_ms += seconds * 1000
            results = [next(rows) for _ in job.tokenized]
            try:
                engine.pipeline.advance(job.rounds, results)
                if not job.rounds.done:  # a second stage: back into this lane, ahead of most by its long wait
                    engine.check_length(job.request, job.rounds.tokenized, [i.name for i in job.rounds.asked])
                    job.tokenized = job.rounds.tokenized
                    job.cost = engine.pipeline.cost(job.tokenized)
                    self.submit(job)
                    continue
                latency = (time.perf_counter() - job.arrival) * 1000
                engine.computed_jobs += 1
                job.finish(engine.pipeline.respond(job.rounds, latency))
            except (EngineClosed, RequestError) as e:
                job.finish(e)
            except Exception as e:
                log.exception("answer failed")
                job.finish(e)
        if stats.prompt_tokens * 4 > TRIM_AFTER_CHARS:
            del logits, rows
            release_free_memory()

    def _drop_gone(self, batch: list[Job]) -> list[Job]:
        """Jobs whose client is still there; the others are answered Cancelled and never computed."""
        gone = [job for job in batch if job.cancelled()]
        for job in gone:
            self.engine.cancelled_jobs += 1
            job.finish(Cancelled())
        return [job for job in batch if job not in gone] if gone else batch

    @staticmethod
    def _fail(batch: list[Job], error: Exception) -> None:
        for job in batch:
            job.finish(error)


@dataclass
class _InFlight:
    """A batch whose device work is queued (its pass paused at `QUEUED`); its readback and answers are to come."""

    batch: list[Job]
    stats: Stats
    steps: Generator
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
) -> tuple[bool, list[list[np.ndarray]] | None]:
    """Run a pass to its end (-> (True, result)); with `pause_at_queued` until it yields `QUEUED`, with `one_step`
    for one step (-> (False, None) there). Every yield is a checkpoint: the pass stops there if `stop()` says so,
    and a preemptible lane offers the device back there (between layers, or inside one where the backend yields)."""
    while True:
        try:
            step = next(steps)
        except StopIteration as done:
            return True, done.value
        if stop() or (holder.checkpoint() and stop()):
            steps.close()
            raise _PassStopped()
        if one_step or (step is QUEUED and pause_at_queued):
            return False, None


class Engine:
    """One model: its pipeline and its lanes."""

    def __init__(
        self, name: str, pipeline: Pipeline, gate: Gate, metrics: Metrics, settings: EngineSettings = EngineSettings()
    ):
        self.name, self.pipeline, self.gate, self.metrics, self.settings = name, pipeline, gate, metrics, settings
        self.main = Lane(self, "main", urgent=True)
        self.long = Lane(self, "long", urgent=False) if settings.long_tokens > 0 else None
        self.computed_jobs = self.cancelled_jobs = self.batches = self.stopped_batches = 0
        self.packed_tokens = self.prompt_tokens = 0  # tokens computed vs in the option-order prompts, all batches
        self.abandoned = False  # shutdown gave up on running work: passes stop at their next checkpoint
        config = pipeline.model.config
        self.prompt_char_limit = settings.limits.max_prompt_chars or (
            config.max_position_embeddings * pipeline.tokenizer.max_token_chars
        )

    def start(self) -> None:
        for lane in self.lanes:
            if not lane.thread.is_alive() and not lane.closing:
                lane.thread.start()

    @property
    def lanes(self) -> list[Lane]:
        return [self.main] + ([self.long] if self.long else [])

    def plan(self, request: DecisionRequest, finish: Callable[[Any], None], cancelled: Callable[[], bool]) -> Job:
        """Check the request's limits, tokenize and cost it (in the planning pool when large, off the event loop).

        Characters are checked before anything is tokenized; packed tokens while tokenizing, a chunk at a time, so
        a request over a limit is refused after at most one chunk of work."""
        arrival = time.perf_counter()
        limits, dialect = self.settings.limits, request.dialect
        context = self.pipeline.model.config.max_position_embeddings
        longest = max((_min_prompt_chars(q) for q in request.questions if q.needs_model), default=0)
        if longest > self.prompt_char_limit:
            raise _limit_error(
                dialect,
                f"a prompt has over {self.prompt_char_limit} characters; the model reads at most {context} tokens",
            )
        total_chars = _prompt_chars(request)
        if total_chars > limits.max_request_chars:
            raise _limit_error(
                dialect,
                f"the prompts of this request hold {total_chars} characters; a request may hold at most "
                f"{limits.max_request_chars} (send fewer questions or a shorter state)",
            )
        if cancelled():
            raise Cancelled()
        rounds = self.pipeline.plan(request)
        tokenized = rounds.tokenized
        later = self.pipeline.later_rounds_estimate(rounds)  # large choices' final rounds, before they are known
        self.check_length(request, [*tokenized, *later], [*(i.name for i in rounds.asked), *rounds.large])
        prompt_tokens = sum(len(p) for t in tokenized for p in t.prompts)
        cost = self.pipeline.cost(tokenized) + (self.pipeline.cost(later) if later else 0)
        if cost > limits.max_request_tokens:
            raise _limit_error(
                dialect,
                f"this request packs {cost} tokens; a request may compute at most {limits.max_request_tokens} "
                "(send fewer questions or a shorter state)",
            )
        return Job(request, tokenized, cost, prompt_tokens, finish, cancelled, arrival, rounds=rounds)

    def check_length(
        self, request: DecisionRequest, tokenized: list[TokenizedQuestion], names: list[str] | None = None
    ) -> None:
        """Refuse a prompt longer than the model's positions (a later round is checked again once planned).
        `names`: the item name of each entry; with them /v1/systemone answers `context_length_exceeded` per
        question (`basal.core.engine.admission`)."""
        limit = self.pipeline.model.config.max_position_embeddings
        longest = max((len(p) for t in tokenized for p in t.prompts), default=0)
        if longest > limit:
            if request.dialect == "systemone" and names is not None:
                raise context_length_error(request, tokenized, names, limit)
            raise _limit_error(request.dialect, f"a prompt has {longest} tokens; the model reads at most {limit}")

    def submit(self, job: Job) -> None:
        """Queue a planned job; one that needs no model (every question has one option) is answered at once."""
        if job.rounds is not None and job.rounds.done:  # every question has a single option: no model run
            job.finish(self.pipeline.respond(job.rounds, (time.perf_counter() - job.arrival) * 1000))
            return
        lane = self.long if self.long and job.cost > self.settings.long_tokens else self.main
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


class InflightLimit:
    """The process's `max_inflight` places and its shutdown state; the HTTP layer takes a place per request.
    Shared by `Engines` and the Ray front (`basal.deploy.ingress.RayEngines`)."""

    def __init__(self, max_inflight: int):
        self.max_inflight = max_inflight
        self._inflight = 0
        self._lock = threading.Lock()
        self.closed = False
        self.draining = False  # shutdown has begun: new requests get 503, /health says so, the listener is open

    @property
    def inflight(self) -> int:
        return self._inflight

    def begin_drain(self) -> None:
        """Shutdown has begun: refuse new requests (503), let /health say "draining", finish what runs."""
        self.draining = True

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One of `max_inflight` places, taken before a request's body is read (so overload costs no parsing).
        Raises Overloaded (529) or EngineClosed (503) at once."""
        with self._lock:
            if self.closed or self.draining:
                raise EngineClosed("the server is shutting down")
            if self._inflight >= self.max_inflight:
                raise Overloaded()
            self._inflight += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1


class Engines(InflightLimit):
    """Every model the process serves: one gate, one in-flight limit, one planning pool."""

    def __init__(
        self, engines: dict[str, Engine], default: str, metrics: Metrics, max_inflight: int = 1024, planners: int = 2
    ):
        super().__init__(max_inflight)
        self.engines, self.default, self.metrics = engines, default, metrics
        self._pool = ThreadPoolExecutor(planners, thread_name_prefix="basal-plan")

    @property
    def names(self) -> list[str]:
        return list(self.engines)

    def model_info(self, name: str) -> ModelInfo:
        pipeline = self.engines[name].pipeline
        return ModelInfo(name, pipeline.model.calibration, pipeline.serves_evidence, pipeline.backend.describe())

    def start(self) -> None:
        for engine in self.engines.values():
            engine.start()

    def ready(self) -> bool:
        """Every model can answer (its lanes run); /health reports it."""
        return all(lane.thread.is_alive() for e in self.engines.values() for lane in e.lanes)

    async def run(
        self, request: DecisionRequest, cancelled: Callable[[], bool] = lambda: False, *, has_slot: bool = False
    ) -> Result:
        """Plan, queue and answer one validated request. Raises Overloaded, EngineClosed, Cancelled, RequestError.
        `has_slot`: the caller already holds a `slot()` (the HTTP layer takes it before reading the body)."""
        if not has_slot:
            with self.slot():
                return await self.run(request, cancelled, has_slot=True)
        engine = self.engines[request.model]
        if self.closed:
            raise EngineClosed("the server is shutting down")
        loop = asyncio.get_running_loop()
        chars = _prompt_chars(request)
        self.metrics.model_inflight.inc(engine.name)
        try:
            future: asyncio.Future = loop.create_future()

            def finish(result: Any) -> None:
                with suppress(RuntimeError):  # the event loop is gone (shutdown): nobody waits for this answer
                    loop.call_soon_threadsafe(_settle, future, result)

            def prepare() -> Job:
                job = engine.plan(request, finish, cancelled)
                engine.submit(job)  # a model-free request is answered here, off the loop when it is large
                return job

            if chars <= INLINE_PLAN_CHARS:  # tokenizing a few short prompts costs less than a hop
                job = prepare()
            else:
                try:
                    job = await loop.run_in_executor(self._pool, prepare)
                except asyncio.CancelledError:  # the planning pool was shut down under it, not this task
                    task = asyncio.current_task()
                    if self.closed and task is not None and not task.cancelling():
                        raise EngineClosed("the server shut down before this request ran") from None
                    raise
            response = await future
            return Result(response, job.queue_ms, job.compute_ms, job.batch_requests)
        finally:
            self.metrics.model_inflight.inc(engine.name, by=-1)
            if chars > TRIM_AFTER_CHARS:
                loop.run_in_executor(self._pool, release_free_memory)

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        """Stop taking requests; finish (drain) or fail what is queued; stop the lanes. `abandon`: running
        passes stop at their next checkpoint too and their requests get EngineClosed (503)."""
        self.closed = True
        for engine in self.engines.values():
            engine.close(drain, timeout, abandon)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _stop_when(engine: Engine, batch: list[Job]) -> Callable[[], bool]:
    """When a running pass stops: the server abandons its work, or no client of the batch is left."""
    return lambda: engine.abandoned or all(job.cancelled() for job in batch)


def _min_prompt_chars(q: Question) -> int:
    """Characters one prompt of `q` has at least (the template around them is not counted; a large choice's
    prompts show a group of its options, so none of them is counted)."""
    item = q.item
    options = 0 if is_large(item) else sum(map(len, item.options))
    return len(item.state_text) + len(item.question_text) + options


def _limit_error(dialect: str, message: str) -> RequestError:
    """A request over a work limit: Jev's token-limit 400 on /v1/systemone, upstream's 422 on /v1/basal."""
    if dialect == "systemone":
        return RequestError(400, {"detail": {"error_type": "max_tokens_exceeded", "message": message}})
    return RequestError(422, {"error": message})


def _prompt_chars(request: DecisionRequest) -> int:
    """Characters to tokenize: every prompt repeats state and question (a large choice asks many groups)."""
    return sum(
        _prompts_of(item) * (len(item.state_text) + len(item.question_text)) + 2 * sum(map(len, item.options))
        for q in request.questions
        for item in q.asked
    )


def _prompts_of(item: Item) -> int:
    return prompt_count(len(item.options), "luce2") if is_large(item) else 2


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
