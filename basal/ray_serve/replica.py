"""One Ray Serve replica: one basal engine (model, backend, dtype, lanes) answering planned requests.

The ingress validates and plans requests (the request parsers) and sends the `DecisionRequest` here; the replica
tokenizes, queues, packs and computes exactly as `basal serve` does, so its answers are bitwise the same. Errors
cross the process boundary as plain data (`ReplicaAnswer.error`) and become the same exceptions on the ingress.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.decision.diagnostics import Diagnostics
from basal.core.engine.front import ModelInfo, Result
from basal.core.engine.memory import freeze_startup_heap
from basal.core.errors import Cancelled, EngineClosed, Overloaded, RequestError
from basal.core.request.plan import DecisionRequest
from basal.ray_serve.reload import generation, replica_watch
from basal.ray_serve.replica_metrics import start_pushing
from basal.serve.config import ServeConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaAnswer:
    """What a replica returns: the answer with its timings, or the error it ended with."""

    replica: str
    response: SystemOneResponse | BasalResponse | None = None
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    pass_requests: int = 0
    error: tuple[str, Any] | None = None  # (kind, detail): request (status, body) | overloaded | closed | cancelled
    diagnostics: Diagnostics | None = None  # only when the request asked for them

    def result(self) -> Result:
        """The engine's `Result` on the ingress side, or the engine's exception raised again."""
        if self.error is not None:
            kind, detail = self.error
            if kind == "request":
                raise RequestError(*detail)
            if kind == "overloaded":
                raise Overloaded()
            if kind == "cancelled":
                raise Cancelled()
            raise EngineClosed(detail)
        assert self.response is not None, "a replica answer without a response or an error; this is a bug"
        return Result(
            self.response,
            self.queue_ms,
            self.compute_ms,
            self.pass_requests,
            replica=self.replica,
            diagnostics=self.diagnostics,
        )


class BasalReplica:
    """The replica class (Ray Serve wraps it with `serve.deployment`). `config` is a `ServeConfig` with exactly
    one model, as plain data."""

    def __init__(self, config: dict[str, Any]):
        from ray import serve

        from basal.serve.reload import reload_calibrations
        from basal.serve.server import build_engines

        cfg = msgspec.convert(config, ServeConfig)
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        seen = _reload_generation()  # before the calibration is read: a reload asked during the load runs too
        self.engines = build_engines(cfg)
        self.engines.start()
        freeze_startup_heap()  # as `basal serve` does: no collector pauses over the loaded model
        self._stop_pushing = start_pushing(self.name, self.engines.metrics.render)  # to the front's /metrics
        specs = dict(zip(self.engines.names, cfg.models, strict=False))  # none for the demo model
        self._stop_reloads = replica_watch(  # SIGHUP to a front: this replica reads its calibration again
            self.name, context.app_name, seen, lambda: reload_calibrations(self.engines, specs)
        )
        log.info("replica %s serving %s", self.name, ", ".join(self.engines.engines))

    async def answer(
        self, request: DecisionRequest, affinity: str | None = None, background: bool = False
    ) -> ReplicaAnswer:
        """Answer one planned request. `affinity` is read by the router, not here; `background`: a batch line, run
        behind this replica's online requests."""
        gone = False
        try:
            result = await self.engines.run(request, lambda: gone, background=background)
        except asyncio.CancelledError:  # the ingress cancelled the call (its client went away)
            gone = True
            raise
        except RequestError as e:
            return ReplicaAnswer(self.name, error=("request", (e.status, e.body)))
        except Overloaded:
            return ReplicaAnswer(self.name, error=("overloaded", None))
        except Cancelled:
            return ReplicaAnswer(self.name, error=("cancelled", None))
        except EngineClosed as e:
            return ReplicaAnswer(self.name, error=("closed", str(e)))
        return ReplicaAnswer(
            self.name,
            result.response,
            result.queue_ms,
            result.compute_ms,
            result.pass_requests,
            diagnostics=result.diagnostics,
        )

    def model_info(self) -> ModelInfo:
        """The facts of this replica's model, for the front's `/v1/models` and request checks."""
        return self.engines.model_info(self.engines.default)

    def stats(self) -> dict[str, Any]:
        """Counters of this replica (benchmarks and tests): jobs, passes, tokens computed vs in the prompts, and its
        state caches' lookups (hits, partial hits, misses)."""
        engines = list(self.engines.engines.values())
        caches = [e.pipeline.state_cache.counts for e in engines if e.pipeline.state_cache is not None]
        return {
            "replica": self.name,
            "computed_jobs": sum(e.computed_jobs for e in engines),
            "cancelled_jobs": sum(e.cancelled_jobs for e in engines),
            "passes": sum(e.passes for e in engines),
            "packed_tokens": sum(e.packed_tokens for e in engines),
            "prompt_tokens": sum(e.prompt_tokens for e in engines),
            "state_hits": sum(c.hits for c in caches),
            "state_partial_hits": sum(c.partial_hits for c in caches),
            "state_misses": sum(c.misses for c in caches),
        }

    def check_health(self) -> None:
        """Ray Serve calls this periodically; raising marks the replica unhealthy and it is replaced."""
        if self.engines.closed or not all(
            lane.thread.is_alive() for e in self.engines.engines.values() for lane in e.lanes
        ):
            raise RuntimeError("the engine's lanes are not running")

    def __del__(self) -> None:
        for name in ("_stop_pushing", "_stop_reloads"):
            if (stop := getattr(self, name, None)) is not None:
                stop.set()
        engines = getattr(self, "engines", None)
        if engines is not None:
            engines.close(drain=False, timeout=5)


def _reload_generation() -> int:
    """The calibration reload generation now (0 when the hub cannot be reached: every later one is run)."""
    try:
        return generation()
    except Exception as e:
        log.warning("the calibration reload hub cannot be reached (%s); this replica follows reloads from now", e)
        return 0
