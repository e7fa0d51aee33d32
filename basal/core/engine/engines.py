"""The engines of a process behind one front: served models, the in-flight limit, planning off the event loop, answers.

`Engines` implements `basal.core.engine.front.EnginesFront` in one process (`basal.ray_serve.ingress.RayEngines` does
on Ray Serve); the HTTP layer depends on that protocol only."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext, suppress
from typing import Any

from basal.core.engine.admission import prompt_chars
from basal.core.engine.engine import TRIM_AFTER_CHARS, Engine
from basal.core.engine.front import InflightLimit, ModelInfo, Result
from basal.core.engine.memory import release_free_memory
from basal.core.engine.metrics import Metrics
from basal.core.engine.scheduler import Job
from basal.core.engine.seam import Answer
from basal.core.errors import EngineClosed
from basal.core.packing.backend import Backend
from basal.core.request.plan import DecisionRequest

INLINE_ADMIT_CHARS = 8192  # requests this small are admitted on the event loop; larger ones in the admission pool


class Engines(InflightLimit):
    """Every model the process serves: one gate, one in-flight limit, one admission pool. `pending`: names of models
    still loading (`basal serve` listens first); each serves once `add`ed, and requests get 503 until all are."""

    def __init__(
        self,
        engines: dict[str, Engine],
        default: str,
        metrics: Metrics,
        max_inflight: int = 1024,
        admitters: int = 2,
        pending: list[str] | tuple[str, ...] = (),
    ):
        super().__init__(max_inflight)
        self.engines, self.default, self.metrics = engines, default, metrics
        for name, engine in engines.items():
            facts = engine.facts()
            metrics.model_served(name, facts.compute, facts.version)
        self._names = [*engines, *pending]
        self.progress = {name: "waiting" for name in pending}
        self._started = False
        self._start_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(admitters, thread_name_prefix="basal-admit")
        # batch lines are admitted in a pool of their own, where each waits for the gate's `host_work`: an online
        # request's admission never queues behind them, and they never take the interpreter from an online pass
        self._background_pool = ThreadPoolExecutor(admitters, thread_name_prefix="basal-admit-bg")

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def add(self, engine: Engine) -> None:
        """A pending model has loaded: its lanes start (if the app has started) and it serves."""
        facts = engine.facts()
        self.metrics.model_served(engine.name, facts.compute, facts.version)
        with self._start_lock:
            self.engines[engine.name] = engine
            if self.closed:
                engine.close(drain=False, timeout=0.0)
                return
            if self._started:
                engine.start()
        self.progress.pop(engine.name, None)

    def backends(self) -> list[tuple[str, Backend]]:
        """Each served model's backend: what device-memory readings at scrape time ask."""
        return [(name, e.pipeline.backend) for name, e in list(self.engines.items())]

    def model_info(self, name: str) -> ModelInfo:
        engine = self.engines[name]
        facts = engine.facts()
        return ModelInfo(
            name,
            facts.calibration,
            facts.serves_evidence,
            facts.compute,
            engine.prompt_char_limit,
            engine.context,
            synthetic=facts.synthetic,
            version=facts.version,
        )

    def start(self) -> None:
        with self._start_lock:
            self._started = True
            for engine in self.engines.values():
                engine.start()

    def ready(self) -> bool:
        """Every model is loaded and can answer (its lanes run); /health/ready reports it."""
        loaded = not self.progress and len(self.engines) == len(self._names)
        return loaded and all(lane.thread.is_alive() for e in self.engines.values() for lane in e.lanes)

    async def run(
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        """Plan, queue and answer one validated request. Raises Overloaded, EngineClosed, Cancelled, RequestError.
        `has_slot`: the caller already holds a `slot()` (the HTTP layer takes it before reading the body).
        `background`: a batch line (behind every online request, on the preemptible lane)."""
        if not has_slot:
            with self.slot():
                return await self.run(request, cancelled, has_slot=True, background=background)
        engine = self.engines[request.model]
        if self.closed:
            raise EngineClosed("the server is shutting down")
        loop = asyncio.get_running_loop()
        chars = prompt_chars(request)
        self.metrics.model_inflight.inc(engine.name)
        try:
            future: asyncio.Future = loop.create_future()

            def finish(result: Any) -> None:
                with suppress(RuntimeError):  # the event loop is gone (shutdown): nobody waits for this answer
                    loop.call_soon_threadsafe(_settle, future, result)

            def prepare() -> Job:
                with engine.gate.host_work() if background else nullcontext():
                    job = engine.admit(request, finish, cancelled, background)
                    engine.submit(job)  # a model-free request is answered here, off the loop when it is large
                return job

            if chars <= INLINE_ADMIT_CHARS and not background:  # a few short prompts cost less than a hop; Batch API
                # lines are always admitted in the pool, so that the event loop stays with online requests
                job = prepare()
            else:
                try:
                    # in the request's context (its id on the admitting thread's log lines and in the job)
                    pool = self._background_pool if background else self._pool
                    job = await loop.run_in_executor(pool, contextvars.copy_context().run, prepare)
                except asyncio.CancelledError:  # the admission pool was shut down under it, not this task
                    task = asyncio.current_task()
                    if self.closed and task is not None and not task.cancelling():
                        raise EngineClosed("the server shut down before this request ran") from None
                    raise
            answer: Answer = await future
            return Result(
                answer.response, job.queue_ms, job.compute_ms, job.pass_requests, diagnostics=answer.diagnostics
            )
        finally:
            self.metrics.model_inflight.inc(engine.name, by=-1)
            if chars > TRIM_AFTER_CHARS:
                loop.run_in_executor(self._pool, release_free_memory)

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        """Stop taking requests; finish (drain) or fail what is queued; stop the lanes. `abandon`: running
        passes stop at their next checkpoint too and their requests get EngineClosed (503)."""
        with self._start_lock:
            self.closed = True
            engines = list(self.engines.values())
        for engine in engines:
            engine.close(drain, timeout, abandon)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._background_pool.shutdown(wait=False, cancel_futures=True)


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
