"""uvicorn around the app: the guarded protocol with the configured limits, and a shutdown that drains.

On SIGTERM uvicorn closes the listener, waits, cancels what still runs (the client of a long request got
``500 text/plain``) and only then runs the app's shutdown, which computed the orphaned job. Here shutdown first
drains with the listener still open: new requests get the dialect's 503 with Retry-After and ``/health`` says
"draining", so a load balancer moves traffic away; requests in flight get `grace_s` to finish. What still runs
then is abandoned: its pass stops at the next checkpoint and its client gets the same JSON 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator

import uvicorn
from litestar import Litestar

from basal.api.http.connection_guard import guarded_protocol
from basal.core.engine.front import EnginesFront
from basal.core.request.limits import DEFAULT_LIMITS, Limits

log = logging.getLogger(__name__)


def server_config(app: Litestar, host: str, port: int, limits: Limits = DEFAULT_LIMITS, **options) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]  # a float works (loop.call_later)
        **options,
    )


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engines: EnginesFront, grace_s: float = 30.0):
        super().__init__(config)
        self.engines, self.grace_s = engines, grace_s
        self.abandoned = 0  # requests still running when the grace period ended

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """A SIGTERM whose drain finished every request is a clean stop: exit status 0, as an orchestrator's stop
        expects (uvicorn raises the signal again after shutdown, which made it 143). A drain that abandoned requests
        keeps the signal's status; SIGINT stays KeyboardInterrupt."""
        with super().capture_signals():
            yield
            if not self.abandoned:  # uvicorn's list of the signals it raises again once its handlers are restored
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    async def shutdown(self, sockets=None) -> None:
        engines = self.engines
        engines.begin_drain()
        deadline = time.monotonic() + self.grace_s
        if engines.inflight:
            log.info("draining: %d requests in flight, up to %.0f s", engines.inflight, self.grace_s)
        while engines.inflight and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if engines.inflight:
            self.abandoned = engines.inflight
            log.warning("shutdown: abandoning %d requests still in flight (503 + Retry-After)", engines.inflight)
            await asyncio.to_thread(engines.close, drain=False, timeout=5.0, abandon=True)
            deadline = time.monotonic() + 5.0
            while engines.inflight and time.monotonic() < deadline:  # their 503s are being sent
                await asyncio.sleep(0.02)
        await super().shutdown(sockets)
