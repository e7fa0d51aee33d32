"""Test servers and engines around the demo model: in-process engines, a live uvicorn on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from basal.api.app import create_app
from basal.api.handling import ApiSettings
from basal.api.listener import DrainingServer, server_config
from basal.backends.cuda.backend import TorchBackend
from basal.core.engine import Engine, Engines, EngineSettings
from basal.core.gate import Gate
from basal.core.metrics import Metrics
from basal.core.model_dir import ModelDir
from basal.core.pipeline import Pipeline


class SlowBackend:
    """The torch backend with a pause after every layer: makes a pass long enough to schedule around.

    `yields_per_layer` > 1 splits the pause into that many yields, as a backend that steps aside inside a layer
    (between row chunks) does."""

    def __init__(self, inner: TorchBackend, layer_s: float, yields_per_layer: int = 1):
        self.inner, self.layer_s, self.yields_per_layer = inner, layer_s, yields_per_layer
        self.name, self.device, self.dtype, self.model = inner.name, inner.device, inner.dtype, inner.model
        self.batches: list[int] = []  # n_tokens of every batch run
        self.yields = 0  # yields handed to the engine so far

    def prefix(self, key, tokens):
        self.inner.prefix(key, tokens)

    def run(self, batch):
        self.batches.append(batch.n_tokens)
        steps = self.inner.run(batch)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            for _ in range(self.yields_per_layer):
                time.sleep(self.layer_s / self.yields_per_layer)
                self.yields += 1
                yield


def make_engines(
    model: ModelDir,
    *,
    max_inflight: int = 1024,
    slow_s: float = 0.0,
    yields_per_layer: int = 1,
    slice_ms: float = 100.0,
    **settings,
) -> Engines:
    backend = TorchBackend.load(model)
    if slow_s:
        backend = SlowBackend(backend, slow_s, yields_per_layer)
    metrics, gate = Metrics(max_inflight), Gate(slice_ms)
    engine = Engine(model.name, Pipeline(model, backend), gate, metrics, EngineSettings(**settings))
    return Engines({model.name: engine}, model.name, metrics, max_inflight)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(engines: Engines, settings: ApiSettings | None = None, grace_s: float = 5.0) -> Iterator[str]:
    """uvicorn serving the app on a free loopback port, in a thread, as `basal serve` runs it; yields the URL."""
    settings = settings or ApiSettings()
    with running_server(engines, settings, grace_s) as (url, _):
        yield url


@contextmanager
def running_server(
    engines: Engines, settings: ApiSettings, grace_s: float = 5.0
) -> Iterator[tuple[str, DrainingServer]]:
    """`live_server` that also yields the server (tests that stop it themselves)."""
    port = free_port()
    config = server_config(
        create_app(engines, settings),
        "127.0.0.1",
        port,
        settings.limits,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(config, engines, grace_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(30)
