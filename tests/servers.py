"""Test servers and engines around the demo model: in-process engines, a live uvicorn on loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from basal.api.app import create_app
from basal.api.http.listener import DrainingServer, server_config
from basal.api.settings import ApiSettings
from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from tests.ports import free_port
from tests.stub_backend import FakeBackend


class SlowBackend(FakeBackend):
    """The torch backend made slow enough to schedule around: a pause of `layer_s` at every layer boundary, or
    (`in_layer=True`) at every pause point inside a layer too, so that one layer alone takes long. Records every
    pause as (inside a layer, perf_counter at the pause, perf_counter at the resume). `on_pause`, if set, is called
    with `inside` at every pause, just before it, until it returns True (then it is cleared). `yields_per_layer` > 1
    splits each pause into that many yields (more pause points, as finer in-layer chunks would give)."""

    def __init__(self, inner: TorchBackend, layer_s: float, in_layer: bool = False, yields_per_layer: int = 1):
        self.inner, self.layer_s, self.in_layer, self.yields_per_layer = inner, layer_s, in_layer, yields_per_layer
        self.name, self.device, self.dtype, self.model = inner.name, inner.device, inner.dtype, inner.model
        self.batches: list[int] = []  # n_tokens of every batch run
        self.pauses: list[tuple[bool, float, float]] = []
        self.yields = 0  # yields handed to the engine so far
        self.on_pause = None
        self._inside = False
        layer = inner.net.layer

        def traced_layer(*args, **kwargs):
            self._inside = True
            try:
                return (yield from layer(*args, **kwargs))
            finally:
                self._inside = False

        inner.net.layer = traced_layer

    def prefix(self, key, tokens, base=None):
        return self.inner.prefix(key, tokens, base)

    def drop_prefix(self, key):
        self.inner.drop_prefix(key)

    def prefix_bytes(self, key):
        return self.inner.prefix_bytes(key)

    def run(self, batch, prepared=None, preemptible=False):
        self.batches.append(batch.n_tokens)
        steps = self.inner.run(batch)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            inside = self._inside
            for _ in range(self.yields_per_layer):
                if self.in_layer or not inside:
                    time.sleep(self.layer_s / self.yields_per_layer)
                if self.on_pause is not None and self.on_pause(inside):
                    self.on_pause = None
                paused = time.perf_counter()
                self.yields += 1
                yield
                self.pauses.append((inside, paused, time.perf_counter()))


def make_engines(
    model: ModelDir,
    *,
    max_inflight: int = 1024,
    slow_s: float = 0.0,
    slow_in_layer: bool = False,
    yields_per_layer: int = 1,
    slice_ms: float = 100.0,
    **settings,
) -> Engines:
    backend = TorchBackend.load(model)
    if slow_s:
        backend = SlowBackend(backend, slow_s, slow_in_layer, yields_per_layer)
    metrics, gate = Metrics(max_inflight), Gate(slice_ms)
    engine = Engine(model.name, Pipeline(model, backend), gate, metrics, EngineSettings(**settings))
    return Engines({model.name: engine}, model.name, metrics, max_inflight)


@contextmanager
def live_server(
    engines: Engines, settings: ApiSettings | None = None, grace_s: float = 5.0, batches=None
) -> Iterator[str]:
    """uvicorn serving the app on a free loopback port, in a thread, as `basal serve` runs it; yields the URL.
    `batches`: a `BatchService` (the Files and Batches API)."""
    settings = settings or ApiSettings()
    with running_server(engines, settings, grace_s, batches) as (url, _):
        yield url


@contextmanager
def running_server(
    engines: Engines, settings: ApiSettings, grace_s: float = 5.0, batches=None
) -> Iterator[tuple[str, DrainingServer]]:
    """`live_server` that also yields the server (tests that stop it themselves)."""
    port = free_port()
    config = server_config(
        create_app(engines, settings, batches=batches),
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


def replica_stats(handle, replicas: int = 2, tries: int = 40) -> dict[str, dict]:
    """Each Ray Serve replica's `stats`, keyed by replica: the router spreads the calls, so ask until every one of
    `replicas` has answered (a few extra calls cover them)."""
    seen: dict[str, dict] = {}
    for _ in range(tries):
        stats = handle.stats.remote().result()
        seen[stats["replica"]] = stats
        if len(seen) == replicas:
            break
    return seen
