"""The engines of a process behind one front: served models, the in-flight limit, planning off the event loop, answers.

The HTTP layer depends on `EnginesFront` only; `Engines` implements it in one process and
`basal.deploy.ingress.RayEngines` on Ray Serve."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.decision.diagnostics import Diagnostics
from basal.core.engine.admission import prompt_chars
from basal.core.engine.engine import TRIM_AFTER_CHARS, Engine
from basal.core.engine.memory import release_free_memory
from basal.core.engine.metrics import Metrics
from basal.core.engine.scheduler import Job
from basal.core.errors import EngineClosed, Loading, Overloaded
from basal.core.model.model_dir import Calibration
from basal.core.request.plan import DecisionRequest

INLINE_PLAN_CHARS = 8192  # requests this small are tokenized on the event loop; larger ones in the planning pool


@dataclass(frozen=True)
class Result:
    response: SystemOneResponse | BasalResponse
    queue_ms: float
    compute_ms: float
    batch_requests: int
    replica: str = ""  # the replica that answered, when scaled out (basal.deploy); "" in one process
    diagnostics: Diagnostics | None = None  # only when the request asked for them


@dataclass(frozen=True)
class ModelInfo:
    """One served model as the HTTP layer sees it, whichever front serves it: what `/v1/models` tells and what the
    request parsers check. Plain data, so that a Ray replica can send it to the front."""

    name: str
    calibration: Calibration
    serves_evidence: bool  # an evidence head, and a backend that reads hidden states
    compute: dict[str, object]  # `Backend.describe()`: what decides the bits of this model's answers
    prompt_char_limit: int = 0  # characters a prompt may hold (`Engine.prompt_char_limit`); 0: unknown
    context: int = 0  # the longest prompt the model reads, in tokens; 0: unknown
    version: str = ""  # basal.json's version (the answer cache's key names it)

    @property
    def prompt_bound(self) -> tuple[int, int] | None:
        """What the parsers check the state against before facts run (None: unknown, nothing checked)."""
        return (self.prompt_char_limit, self.context) if self.prompt_char_limit else None


class EnginesFront(Protocol):
    """What the HTTP layer needs of the engines behind it: served names, model facts, admission, answers, and the
    process's state. `Engines` (one process) and `basal.deploy.ingress.RayEngines` (Ray Serve) implement it; the
    HTTP layer never reaches past it."""

    default: str
    metrics: Metrics
    max_inflight: int
    closed: bool
    draining: bool
    progress: dict[str, str]  # models still loading -> their step; empty once every model serves

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
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        """Answer one validated request. Raises Overloaded, EngineClosed, Cancelled, RequestError. `background`:
        a batch line, run behind every online request (docs/batches.md)."""
        ...


class InflightLimit:
    """The process's `max_inflight` places and its shutdown state; the HTTP layer takes a place per request.
    Shared by `Engines` and the Ray front (`basal.deploy.ingress.RayEngines`)."""

    def __init__(self, max_inflight: int):
        self.max_inflight = max_inflight
        self._inflight = 0
        self._lock = threading.Lock()
        self.closed = False
        self.draining = False  # shutdown has begun: new requests get 503, /health says so, the listener is open
        self.progress: dict[str, str] = {}  # model still loading -> its step (/health/ready); empty once all serve

    @property
    def inflight(self) -> int:
        return self._inflight

    def begin_drain(self) -> None:
        """Shutdown has begun: refuse new requests (503), let /health say "draining", finish what runs."""
        self.draining = True

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One of `max_inflight` places, taken once a request's body is in (a slow body holds none).
        Raises Overloaded (529) or EngineClosed (503) at once."""
        with self._lock:
            if self.closed or self.draining:
                raise EngineClosed("the server is shutting down")
            if self.progress:
                raise Loading(f"still loading: {', '.join(self.progress)}")
            if self._inflight >= self.max_inflight:
                raise Overloaded()
            self._inflight += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1


class Engines(InflightLimit):
    """Every model the process serves: one gate, one in-flight limit, one planning pool. `pending`: names of models
    still loading (`basal serve` listens first); each serves once `add`ed, and requests get 503 until all are."""

    def __init__(
        self,
        engines: dict[str, Engine],
        default: str,
        metrics: Metrics,
        max_inflight: int = 1024,
        planners: int = 2,
        pending: list[str] | tuple[str, ...] = (),
    ):
        super().__init__(max_inflight)
        self.engines, self.default, self.metrics = engines, default, metrics
        for name, engine in engines.items():
            metrics.model_served(name, engine.pipeline.backend.describe(), engine.pipeline.model.version)
        self._names = [*engines, *pending]
        self.progress = {name: "waiting" for name in pending}
        self._started = False
        self._start_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(planners, thread_name_prefix="basal-plan")

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def add(self, engine: Engine) -> None:
        """A pending model has loaded: its lanes start (if the app has started) and it serves."""
        self.metrics.model_served(engine.name, engine.pipeline.backend.describe(), engine.pipeline.model.version)
        with self._start_lock:
            self.engines[engine.name] = engine
            if self.closed:
                engine.close(drain=False, timeout=0.0)
                return
            if self._started:
                engine.start()
        self.progress.pop(engine.name, None)

    def model_info(self, name: str) -> ModelInfo:
        engine = self.engines[name]
        pipeline = engine.pipeline
        return ModelInfo(
            name,
            pipeline.model.calibration,
            pipeline.serves_evidence,
            pipeline.backend.describe(),
            engine.prompt_char_limit,
            engine.context,
            pipeline.model.version,
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
                job = engine.admit(request, finish, cancelled, background)
                engine.submit(job)  # a model-free request is answered here, off the loop when it is large
                return job

            if chars <= INLINE_PLAN_CHARS and not background:  # a few short prompts cost less than a hop; batch
                # lines are always planned in the pool, so that the event loop stays with online requests
                job = prepare()
            else:
                try:
                    # in the request's context (its id on the planning thread's log lines and in the job)
                    job = await loop.run_in_executor(self._pool, contextvars.copy_context().run, prepare)
                except asyncio.CancelledError:  # the planning pool was shut down under it, not this task
                    task = asyncio.current_task()
                    if self.closed and task is not None and not task.cancelling():
                        raise EngineClosed("the server shut down before this request ran") from None
                    raise
            response = await future
            diagnostics = engine.pipeline.diagnose(job.rounds) if request.diagnostics else None
            return Result(response, job.queue_ms, job.compute_ms, job.batch_requests, diagnostics=diagnostics)
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


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
