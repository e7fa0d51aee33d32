"""What the HTTP layer and the batch lines ask of the engines behind them, whichever front serves them.

`EnginesFront` is the protocol; `ModelInfo` and `Result` are its plain data (a Ray replica sends them to the front),
and `InflightLimit` the in-flight places and shutdown state both fronts share. `Engines` (`engines.py`) implements
the protocol in one process, `basal.ray_serve.ingress.RayEngines` on Ray Serve. This module imports no engine, so the
Ray front and the HTTP layer do not load one to name what they talk to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.decision.diagnostics import Diagnostics
from basal.core.engine.metrics import Metrics
from basal.core.errors import EngineClosed, Loading, Overloaded
from basal.core.model.model_dir import Calibration
from basal.core.request.plan import DecisionRequest

if TYPE_CHECKING:
    from basal.core.engine.cascade import CascadeReport


@dataclass(frozen=True)
class Result:
    response: SystemOneResponse | BasalResponse
    queue_ms: float
    compute_ms: float
    pass_requests: int
    replica: str = ""  # the replica that answered, when scaled out (basal.ray_serve); "" in one process
    diagnostics: Diagnostics | None = None  # only when the request asked for them
    cascade: CascadeReport | None = None  # a cascade's request: who answered what (basal.core.engine.cascade)


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
    synthetic: bool = False  # random weights (the demo model, `basal synth-model`): its answers carry no meaning
    cascade: tuple[dict[str, Any], ...] = ()  # a cascade's name: its steps and their rules; () for a model
    version: str = ""  # basal.json's version (the answer cache's key names it)

    @property
    def prompt_bound(self) -> tuple[int, int] | None:
        """What the parsers check the state against before facts run (None: unknown, nothing checked)."""
        return (self.prompt_char_limit, self.context) if self.prompt_char_limit else None


class EnginesFront(Protocol):
    """What the HTTP layer needs of the engines behind it: served names, model facts, admission, answers, and the
    process's state. `Engines` (one process) and `basal.ray_serve.ingress.RayEngines` (Ray Serve) implement it; the
    HTTP layer never reaches past it."""

    default: str
    metrics: Metrics
    max_inflight: int
    closed: bool
    draining: bool
    progress: dict[str, str]  # models still loading -> their step; empty once every model serves
    startup: dict[str, dict[str, float]]  # loaded models -> seconds of each start-up step (/health/ready)

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
    Shared by `Engines` and the Ray front (`basal.ray_serve.ingress.RayEngines`)."""

    def __init__(self, max_inflight: int):
        self.max_inflight = max_inflight
        self._inflight = 0
        self._lock = threading.Lock()
        self.closed = False
        self.draining = False  # shutdown has begun: new requests get 503, /health says so, the listener is open
        self.progress: dict[str, str] = {}  # model still loading -> its step (/health/ready); empty once all serve
        self.startup: dict[str, dict[str, float]] = {}  # loaded model -> seconds of each start-up step

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


class WrappedFront:
    """A front around another (`EnginesFront`): every member reads through to `inner`, so a wrapper (cascades,
    shadow traffic, drift series) overrides only what it changes, and a member the protocol gains reaches every
    wrapper at once."""

    def __init__(self, inner: EnginesFront):
        self.inner = inner

    @property
    def default(self) -> str:
        return self.inner.default

    @property
    def metrics(self) -> Metrics:
        return self.inner.metrics

    @property
    def max_inflight(self) -> int:
        return self.inner.max_inflight

    @property
    def closed(self) -> bool:
        return self.inner.closed

    @property
    def draining(self) -> bool:
        return self.inner.draining

    @property
    def progress(self) -> dict[str, str]:
        return self.inner.progress

    @property
    def startup(self) -> dict[str, dict[str, float]]:
        return self.inner.startup

    @property
    def names(self) -> list[str]:
        return self.inner.names

    @property
    def inflight(self) -> int:
        return self.inner.inflight

    def model_info(self, name: str) -> ModelInfo:
        return self.inner.model_info(name)

    def slot(self) -> AbstractContextManager[None]:
        return self.inner.slot()

    def begin_drain(self) -> None:
        self.inner.begin_drain()

    def ready(self) -> bool:
        return self.inner.ready()

    def start(self) -> None:
        self.inner.start()

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        self.inner.close(drain, timeout, abandon)

    async def run(
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        return await self.inner.run(request, cancelled, has_slot=has_slot, background=background)

    def forget_calibrations(self) -> None:
        """A calibration was reloaded: a wrapper that keeps something read from one (a threshold) drops it, then
        passes the word inward. Safe from another thread (the reload's)."""
        if isinstance(self.inner, WrappedFront):
            self.inner.forget_calibrations()
