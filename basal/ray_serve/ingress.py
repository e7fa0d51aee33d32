"""The ingress side of a Ray deployment: the basal HTTP front calls model replicas through deployment handles.

`RayEngines` implements `basal.core.engine.front.EnginesFront` as `basal.core.engine.engines.Engines` does in one
process — the Litestar app cannot tell them apart: the same in-flight limit (529), the same errors, and a `Result`
per request, plus the replica that answered. Each call carries the request's affinity key for the router. A replica
that dies during a call is retried once on another replica (answers are deterministic, so a retry is safe); a
client that goes away cancels the call, and the replica drops the job before it is computed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError

from basal.core.engine.front import InflightLimit, ModelInfo, Result
from basal.core.engine.metrics import Metrics
from basal.core.errors import Cancelled, EngineClosed
from basal.core.request.plan import DecisionRequest
from basal.ray_serve.affinity import AFFINITY_MIN_CHARS, affinity_key
from basal.ray_serve.replica import ReplicaAnswer
from basal.ray_serve.replica_metrics import ReplicaCollector

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often a waiting call checks whether its client went away
RETRYABLE = (RayActorError, ActorUnavailableError)


class RayEngines(InflightLimit):
    """Deployment handles by served model name, behind `EnginesFront` (as `Engines` in one process). `infos`: each
    model's facts, as one of its replicas reported them at start."""

    def __init__(
        self,
        handles: dict[str, Any],
        infos: dict[str, ModelInfo],
        default: str,
        max_inflight: int = 1024,
        affinity_min_chars: int = AFFINITY_MIN_CHARS,
        ready: Callable[[], bool] = lambda: True,
    ):
        super().__init__(max_inflight)
        self.handles, self.infos, self.default = handles, infos, default
        self.metrics = Metrics(max_inflight)
        self.metrics.add_collector(ReplicaCollector())  # the replicas' engine series, labelled by replica
        for name, info in infos.items():
            self.metrics.model_served(name, info.compute, "")
        self.affinity_min_chars = affinity_min_chars
        self._ready = ready
        self.retries = 0

    @property
    def names(self) -> list[str]:
        return list(self.handles)

    def model_info(self, name: str) -> ModelInfo:
        return self.infos[name]

    def refresh(self, timeout_s: float = 60.0) -> list[str]:
        """Ask a replica of each model for its facts again (after a calibration reload: `basal.ray_serve.reload`);
        -> the models whose announced calibration changed."""
        changed = []
        for name, handle in self.handles.items():
            info: ModelInfo = handle.model_info.remote().result(timeout_s=timeout_s)
            old = self.infos[name].calibration
            if (info.calibration.path, info.calibration.sha256) != (old.path, old.sha256):
                changed.append(name)
            self.infos[name] = info
        return changed

    def start(self) -> None:
        """Replicas are started by Ray Serve before the front listens."""

    def ready(self) -> bool:
        return self._ready()

    def close(self, drain: bool = True, timeout: float = 30.0, abandon: bool = False) -> None:
        self.closed = True

    async def run(
        self,
        request: DecisionRequest,
        cancelled: Callable[[], bool] = lambda: False,
        *,
        has_slot: bool = False,
        background: bool = False,
    ) -> Result:
        """As `Engines.run`; a `background` request (a batch line) goes through the same router, with the same
        affinity key (the lines of a state land on its replica), and runs there behind its online requests."""
        if not has_slot:
            with self.slot():
                return await self.run(request, cancelled, has_slot=True, background=background)
        if self.closed:
            raise EngineClosed("the server is shutting down")
        key = affinity_key(request, self.affinity_min_chars)
        handle = self.handles[request.model]

        async def call() -> Result:
            call = handle.answer.remote(request, affinity=key, background=background)
            answer: ReplicaAnswer = await _cancellable(call, cancelled)
            return answer.result()

        try:
            return await call()
        except RETRYABLE as e:
            self.retries += 1
            log.warning("a replica died while answering a request; retrying once on another (%s)", e)
        try:
            return await call()
        except RETRYABLE as e:
            raise EngineClosed("two replicas failed while answering this request; retry later") from e


async def _cancellable(response: Any, cancelled: Callable[[], bool]) -> ReplicaAnswer:
    """Await a handle call; cancel it (and raise Cancelled) once the client is gone."""
    pending = asyncio.ensure_future(response)
    while True:
        done, _ = await asyncio.wait({pending}, timeout=POLL_S)
        if done:
            return pending.result()
        if cancelled():
            response.cancel()
            pending.cancel()
            raise Cancelled()
