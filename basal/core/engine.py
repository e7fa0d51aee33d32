"""The engine of one model, and the process that holds several.

    HTTP handler --plan (thread pool: tokenize, cost)--> Engine.submit --> main lane | long lane (threads)
                 <--------------- future resolved from the lane thread ------------------

Each lane is a thread with its own `JobQueue`; a request over `long_tokens` packed tokens goes to the long lane.
All lanes of all models share one `Gate`, so one batch computes at a time, main lanes first, and a long pass
steps aside between layers (`basal.core.gate`). A request whose client went away is dropped before admission.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from basal.core.contract import BasalResponse, DecisionRequest, SystemOneResponse
from basal.core.errors import RequestError
from basal.core.gate import Gate, Holder
from basal.core.large_choice import is_large, prompt_count
from basal.core.metrics import Metrics
from basal.core.pipeline import Pipeline, Stats
from basal.core.prompt import Item
from basal.core.scheduler import Job, JobQueue, Policy
from basal.core.tree import TokenizedQuestion

log = logging.getLogger(__name__)

INLINE_PLAN_CHARS = 8192  # requests this small are tokenized on the event loop; larger ones in the planning pool


class Overloaded(Exception):
    """More than `max_inflight` requests are waiting or running (HTTP 529)."""


class EngineClosed(Exception):
    """The server is shutting down (HTTP 503)."""


class Cancelled(Exception):
    """The client went away before the request was admitted; it was never computed."""


@dataclass(frozen=True)
class Result:
    response: SystemOneResponse | BasalResponse
    queue_ms: float
    compute_ms: float
    batch_requests: int
    replica: str = ""  # the replica that answered, when scaled out (basal.deploy); "" in one process


@dataclass(frozen=True)
class EngineSettings:
    max_batch_tokens: int = 8192
    schedule: Policy = Policy.HRRN
    long_tokens: int = 4096  # 0: no long lane


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
        while True:
            with self.cv:
                while not len(self.queue) and not self.closing:
                    self.cv.wait()
                for job in self.queue.drop_cancelled():
                    self.engine.cancelled_jobs += 1
                    job.finish(Cancelled())
                if self.closing and (not len(self.queue) or not self.drain):
                    rest = self.queue.admit(1 << 62)
                    break
                batch = self.queue.admit(self.engine.settings.max_batch_tokens)
            if batch:
                self._run(batch)
        for job in rest:
            job.finish(EngineClosed("the server shut down before this request ran"))

    def _run(self, batch: list[Job]) -> None:
        engine, metrics = self.engine, self.engine.metrics
        stats = Stats()
        outcome = "ok"
        with engine.gate.hold(self.urgent) as holder:
            started = time.perf_counter()
            gone = [job for job in batch if job.cancelled()]  # the client left while the batch waited for the device
            for job in gone:
                self.engine.cancelled_jobs += 1
                job.finish(Cancelled())
            batch = [job for job in batch if job not in gone]
            if not batch:
                return
            tokenized = [t for job in batch for t in job.tokenized]
            for job in batch:
                if job.rounds is None or job.rounds.round == 0:  # a later round re-enters: keep its first wait
                    job.queue_ms = (started - job.arrival) * 1000
                    metrics.queue_duration.observe(engine.name, self.name, value=job.queue_ms / 1000)
                job.batch_requests = len(batch)
            try:
                logits = _drive(engine.pipeline.letter_logits(tokenized, stats), holder)
            except Exception as e:  # a bug or a device failure: fail this batch, keep serving
                log.exception("batch of %d requests failed", len(batch))
                outcome, logits = "error", e
        seconds = time.perf_counter() - started
        metrics.batch_duration.observe(engine.name, self.name, outcome, value=seconds)
        metrics.batch_requests.observe(engine.name, self.name, value=len(batch))
        engine.batches += 1
        if isinstance(logits, Exception):
            for job in batch:
                job.finish(logits)
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
                    engine.check_length(job.request, job.rounds.tokenized)
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


def _drive(steps, holder: Holder) -> list[list[np.ndarray]]:
    """Run a pass to its end; a preemptible lane offers the device back between layers."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        holder.checkpoint()


class Engine:
    """One model: its pipeline and its lanes."""

    def __init__(
        self, name: str, pipeline: Pipeline, gate: Gate, metrics: Metrics, settings: EngineSettings = EngineSettings()
    ):
        self.name, self.pipeline, self.gate, self.metrics, self.settings = name, pipeline, gate, metrics, settings
        self.main = Lane(self, "main", urgent=True)
        self.long = Lane(self, "long", urgent=False) if settings.long_tokens > 0 else None
        self.computed_jobs = self.cancelled_jobs = self.batches = 0
        self.packed_tokens = self.prompt_tokens = 0  # tokens computed vs in the option-order prompts, all batches

    def start(self) -> None:
        for lane in self.lanes:
            if not lane.thread.is_alive() and not lane.closing:
                lane.thread.start()

    @property
    def lanes(self) -> list[Lane]:
        return [self.main] + ([self.long] if self.long else [])

    def plan(self, request: DecisionRequest, finish: Callable[[Any], None], cancelled: Callable[[], bool]) -> Job:
        """Tokenize and cost a validated request (runs in the planning pool, off the event loop)."""
        arrival = time.perf_counter()
        rounds = self.pipeline.plan(request)
        tokenized = rounds.tokenized
        later = self.pipeline.later_rounds_estimate(rounds)  # large choices' final rounds, before they are known
        self.check_length(request, [*tokenized, *later])
        prompt_tokens = sum(len(p) for t in tokenized for p in t.prompts)
        cost = self.pipeline.cost(tokenized) + (self.pipeline.cost(later) if later else 0)
        return Job(request, tokenized, cost, prompt_tokens, finish, cancelled, arrival, rounds=rounds)

    def check_length(self, request: DecisionRequest, tokenized: list[TokenizedQuestion]) -> None:
        """Refuse a prompt longer than the model's positions (a later round is checked again once planned)."""
        limit = self.pipeline.model.config.max_position_embeddings
        longest = max((len(p) for t in tokenized for p in t.prompts), default=0)
        if longest > limit:
            message = f"a prompt has {longest} tokens; the model reads at most {limit}"
            if request.dialect == "systemone":
                raise RequestError(400, {"detail": {"error_type": "max_tokens_exceeded", "message": message}})
            raise RequestError(422, {"error": message})

    def submit(self, job: Job) -> None:
        if job.rounds is not None and job.rounds.done:  # every question has a single option: no model run
            job.finish(self.pipeline.respond(job.rounds, (time.perf_counter() - job.arrival) * 1000))
            return
        lane = self.long if self.long and job.cost > self.settings.long_tokens else self.main
        lane.submit(job)

    def close(self, drain: bool = True, timeout: float = 30.0) -> None:
        for lane in self.lanes:
            lane.close(drain)
        deadline = time.monotonic() + timeout
        for lane in self.lanes:
            if lane.thread.is_alive():
                lane.thread.join(max(0.0, deadline - time.monotonic()))


class Engines:
    """Every model the process serves: one gate, one in-flight limit, one planning pool."""

    def __init__(
        self, engines: dict[str, Engine], default: str, metrics: Metrics, max_inflight: int = 1024, planners: int = 2
    ):
        self.engines, self.default, self.metrics, self.max_inflight = engines, default, metrics, max_inflight
        self._inflight = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(planners, thread_name_prefix="basal-plan")
        self.closed = False

    @property
    def inflight(self) -> int:
        return self._inflight

    def start(self) -> None:
        for engine in self.engines.values():
            engine.start()

    def ready(self) -> bool:
        """Every model can answer (its lanes run); /health reports it."""
        return all(lane.thread.is_alive() for e in self.engines.values() for lane in e.lanes)

    def _enter(self, model: str) -> None:
        with self._lock:
            if self.closed:
                raise EngineClosed("the server is shutting down")
            if self._inflight >= self.max_inflight:
                raise Overloaded()
            self._inflight += 1
        self.metrics.model_inflight.inc(model)

    def _leave(self, model: str) -> None:
        with self._lock:
            self._inflight -= 1
        self.metrics.model_inflight.inc(model, by=-1)

    async def run(self, request: DecisionRequest, cancelled: Callable[[], bool] = lambda: False) -> Result:
        """Plan, queue and answer one validated request. Raises Overloaded, EngineClosed, Cancelled, RequestError."""
        engine = self.engines[request.model]
        self._enter(engine.name)
        try:
            loop = asyncio.get_running_loop()
            future: asyncio.Future = loop.create_future()

            def finish(result: Any) -> None:
                loop.call_soon_threadsafe(_settle, future, result)

            if _prompt_chars(request) <= INLINE_PLAN_CHARS:  # tokenizing a few short prompts costs less than a hop
                job = engine.plan(request, finish, cancelled)
            else:
                job = await loop.run_in_executor(self._pool, engine.plan, request, finish, cancelled)
            engine.submit(job)
            response = await future
            return Result(response, job.queue_ms, job.compute_ms, job.batch_requests)
        finally:
            self._leave(engine.name)

    def close(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop taking requests; finish (drain) or fail what is queued; stop the lanes."""
        self.closed = True
        for engine in self.engines.values():
            engine.close(drain, timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)


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
