"""The composition root of `basal serve`: configuration -> models -> engines -> Litestar app -> uvicorn."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basal.api.http.capture import Capture
from basal.api.settings import ApiSettings
from basal.backends.load import load_backend, load_backend_class, pick_backend
from basal.batch.service import BatchService, BatchSettings
from basal.batch.store import open_store, redact
from basal.core.engine.answer_cache import AnswerCache
from basal.core.engine.cascade import Cascade, CascadeError, CascadeFront, Rule, Step, check_thresholds
from basal.core.engine.drift import with_drift
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.front import EnginesFront, WrappedFront
from basal.core.engine.gate import Gate
from basal.core.engine.memory import freeze_startup_heap
from basal.core.engine.metrics import CacheCollector, CallbackCollector, Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.engine.scheduler import Policy
from basal.core.engine.shadow import Shadow, ShadowFront
from basal.core.home import cache_dir
from basal.core.model.model_dir import ModelDir, served_calibration
from basal.core.model.synth import demo_model
from basal.progress import Progress
from basal.serve.config import (
    DEMO_PATH,
    CascadeStepConfig,
    ConfigError,
    ModelConfig,
    ServeConfig,
    environment_api_keys,
    is_loopback,
)
from basal.serve.hub import snapshot
from basal.serve.port_check import check_port
from basal.serve.reload import reload_on_sighup

if TYPE_CHECKING:
    from basal.api.http.listener import DrainingServer

log = logging.getLogger("basal")

RAY_WINDOW = 64  # batch lines in flight behind the Ray front (of replicas x max_ongoing_requests places)

DEMO_WARNING = (
    "serving the built-in demo model {name}: a tiny synthetic model with random weights — its answers "
    "carry no meaning. Pass --model DIR (or --config FILE) to serve a real Basal model."
)


def model_directory(cfg: ModelConfig) -> ModelDir:
    """The model a `models:` entry names (its directory, the download of its repo, or the demo), under its `name`."""
    model = _source_directory(cfg)
    model = dataclasses.replace(model, calibration=served_calibration(model.path, cfg.calibration))
    return dataclasses.replace(model, name=cfg.name) if cfg.name else model


def _source_directory(cfg: ModelConfig) -> ModelDir:
    if cfg.is_demo:
        return demo_model()
    if cfg.path is not None:
        return ModelDir.load(cfg.path)
    assert cfg.repo is not None  # ModelConfig has exactly one of path and repo
    return ModelDir.load(snapshot(cfg.repo, cfg.revision))


def build_engines(config: ServeConfig, models: list[ModelDir] | None = None, progress: bool = False) -> Engines:
    """Load every configured model (or the demo model) and wire its engine to the shared gate.

    Every directory is read (and every name checked) before any weights load; with `progress`, each model's
    steps are shown on standard error (`basal.progress`: a bar on a terminal, a line per step otherwise).
    """
    engines, sources = pending_engines(config, models)
    load_models(engines, sources, config, progress)
    return engines


def pending_engines(
    config: ServeConfig, models: list[ModelDir] | None = None
) -> tuple[Engines, list[tuple[ModelConfig, ModelDir]]]:
    """The front of every configured model before any weights load: names are known (and checked), so the listener
    can open and answer probes (`/health/ready` says "loading") while `load_models` fills it in."""
    metrics = Metrics(config.max_inflight)
    specs = config.models or [ModelConfig(path=DEMO_PATH)]
    dirs = models if models is not None else [model_directory(spec) for spec in specs]
    _check_names(specs, dirs)
    default = config.default_model or dirs[0].name
    if default not in [d.name for d in dirs]:
        raise ConfigError(
            f"default_model {default!r} is not among the served models: {', '.join(d.name for d in dirs)}"
        )
    for spec, model in zip(specs, dirs, strict=True):  # said before the bar, which would tear them
        if spec.is_demo:
            log.warning(DEMO_WARNING.format(name=model.name))
        elif model.synthetic:
            log.warning("%s is a synthetic model: its answers carry no meaning", model.name)
    engines = Engines({}, default, metrics, config.max_inflight, pending=[d.name for d in dirs])
    for collector in device_memory(engines):
        metrics.add_collector(collector)
    metrics.add_collector(state_cache_series(engines))
    return engines, list(zip(specs, dirs, strict=True))


def load_models(
    engines: Engines, sources: list[tuple[ModelConfig, ModelDir]], config: ServeConfig, progress: bool = False
) -> None:
    """Load the weights of every model of `sources`, warm it up and add it to `engines` (it serves from then on).
    Stops between models once the front is closed (a SIGTERM during the load)."""
    gate = Gate(config.long_slice_ms, config.long_share)
    if config.threads is not None:
        from basal.backends.cuda.cpu.threads import configure_threads

        configure_threads(config.threads)
    with Progress("loading", 2 * len(sources), emit=log.info, enabled=progress) as shown:
        for spec, model in sources:
            if engines.closed:
                return
            started = time.perf_counter()
            steps: dict[str, float] = {}  # each start-up step's seconds (/health/ready's `startup`, the log)
            engines.progress[model.name] = "loading weights"
            with shown.step(f"{model.name}: weights, {_size_on_disk(model)} ({spec.backend} backend)"):
                load_backend_class(pick_backend(spec.backend))  # the backend's imports (torch), timed apart
                steps["backend import"] = time.perf_counter() - started
                backend = load_backend(model, spec.backend, spec.dtype)
                steps["weights, kernels and probes"] = time.perf_counter() - started - sum(steps.values())
            graphs = " and CUDA graphs" if backend.device.startswith("cuda") else ""  # the GPU path warms up
            engines.progress[model.name] = f"warming up: template prefix{graphs}"
            with shown.step(f"{model.name}: template prefix{graphs} on {backend.name} {backend.device}"):
                pipeline = Pipeline(
                    model,
                    backend,
                    prefix_cache=not spec.no_prefix_cache,
                    tree_max_tokens=spec.tree_max_tokens,
                    large_choice=spec.large_choice,
                    state_cache_mb=spec.state_cache_mb,
                )
                backend.warm_up()  # after the prefixes: setting a prefix drops every graph
            seconds = time.perf_counter() - started
            steps[f"template prefix{graphs}"] = seconds - sum(steps.values())
            engines.startup[model.name] = {step: round(s, 3) for step, s in steps.items()}
            shown.write(
                f"loaded {model.name} on {backend.name} {backend.device} ({backend.dtype}) in {seconds:.1f} s ("
                + ", ".join(f"{step} {s:.2f} s" for step, s in steps.items())
                + ")"
            )
            engines.metrics.model_load.set(model.name, value=seconds)
            settings = EngineSettings(spec.max_batch_tokens, Policy(spec.schedule), spec.long_tokens, config.limits)
            engines.add(Engine(model.name, pipeline, gate, engines.metrics, settings))


def device_memory(engines: Engines) -> list[CallbackCollector]:
    """Device memory per loaded model, read at scrape time: `basal_device_memory_bytes{model, device}` is what torch
    has allocated on the model's CUDA device, or what MLX's allocator holds in arrays (Metal or CPU);
    `basal_device_memory_peak_bytes` and `basal_device_memory_cache_bytes` are MLX's peak and its freed-but-kept
    buffer cache. MLX's figures are the process's (its models share one allocator). No samples for torch on the
    CPU, whose memory is the process's `process_resident_memory_bytes`."""

    loaded = engines.backends

    def read_active():
        models = loaded()
        cuda = [(name, b.device) for name, b in models if b.device.startswith("cuda")]
        if cuda:
            import torch

            for name, device in cuda:
                yield (name, device), float(torch.cuda.memory_allocated(device))
        yield from mlx_memory(models, "active")

    return [
        CallbackCollector(
            "basal_device_memory_bytes", "device memory allocated by the model's backend", ("model", "device"),
            read_active,
        ),
        CallbackCollector(
            "basal_device_memory_peak_bytes", "the most device memory MLX has held (MLX models)", ("model", "device"),
            lambda: mlx_memory(loaded(), "peak"),
        ),
        CallbackCollector(
            "basal_device_memory_cache_bytes", "memory MLX keeps cached for reuse (MLX models)", ("model", "device"),
            lambda: mlx_memory(loaded(), "cache"),
        ),
    ]  # fmt: skip


def mlx_memory(models: list[tuple[str, Any]], kind: str):
    """((model, device), bytes) for each MLX model: MLX's `get_{kind}_memory()` (top level since MLX 0.22, under
    `mx.metal` before); nothing where the installed MLX has neither."""
    served = [(name, backend.device) for name, backend in models if backend.name == "mlx"]
    if not served:
        return
    import mlx.core as mx

    read = getattr(mx, f"get_{kind}_memory", None) or getattr(getattr(mx, "metal", None), f"get_{kind}_memory", None)
    if read is not None:
        value = float(read())
        for name, device in served:
            yield (name, device), value


def _size_on_disk(model: ModelDir) -> str:
    size = sum(f.stat().st_size for f in model.weight_files)
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{max(1, round(size / 2**20))} MiB"


def _check_names(specs: list[ModelConfig], dirs: list[ModelDir]) -> None:
    """Served names are unique: two entries with the same name are refused before any weights load."""
    first: dict[str, int] = {}
    for i, model in enumerate(dirs):
        if model.name in first:
            j = first[model.name]
            where = specs[i].path or specs[i].repo
            raise ConfigError(
                f"`models[{j}]` and `models[{i}]` are both named {model.name!r}; each served model needs its own "
                f"name: add `name: {model.name}-2` (any unused name) to models[{i}] ({where})"
            )
        first[model.name] = i


def api_settings(config: ServeConfig) -> ApiSettings:
    keys = list(config.api_keys)
    keys += [k for k in environment_api_keys() if k not in keys]  # BASAL_API_KEYS adds to the file's
    tracer = None
    if config.otlp_endpoint:
        from basal.observability.tracing import otlp_tracer

        tracer = otlp_tracer(config.otlp_endpoint)
    answers = None
    if config.answer_cache_entries:
        answers = AnswerCache(
            config.answer_cache_entries, int(config.answer_cache_mb * (1 << 20)), config.answer_cache_ttl_s
        )
    return ApiSettings(
        tuple(keys),
        int(config.max_body_mb * (1 << 20)),
        config.release_date,
        config.metrics,
        limits=config.limits,
        cors_origins=tuple(config.cors_origins),
        public_metrics_and_schema=config.public_metrics_and_schema,
        access_log=config.access_log,
        tracer=tracer,
        capture=_capture(config),
        answer_cache=answers,
        caches_shared=config.caches_shared,
        admin_keys=tuple(config.admin_api_keys),
        batches_shared=config.batches_shared,
    )


def _capture(config: ServeConfig) -> Capture | None:
    c = config.capture
    if c.path is None:
        return None
    log.warning(
        "capturing %.0f%% of valid requests to %s%s: personal data where states are (docs/replay.md)",
        c.sample * 100,
        c.path,
        " (states hashed)" if c.hash_state else "",
    )
    return Capture(c.path, c.sample, int(c.max_mb * (1 << 20)), c.keep, c.hash_state)


def exposure_warnings(config: ServeConfig, settings: ApiSettings) -> list[str]:
    """What an operator should know before others can reach the server: no API key on an address other machines
    reach, and CORS open to every origin (docs/configuration.md, "API keys")."""
    out = []
    if not settings.api_keys and not is_loopback(config.host):
        chosen = " (--no-auth)" if config.no_auth else ""
        out.append(
            f"no API key{chosen}: anyone who reaches {config.addr} can use this server; give --api-key KEY "
            "(or BASAL_API_KEYS) unless a proxy in front of it checks who calls"
        )
    if "*" in config.cors_origins:
        out.append(
            "cors_origins has '*': any web page a user opens may read this server's answers from their browser; "
            "list the origins that need it instead"
        )
    return out


def answer_cache_series(cache: AnswerCache) -> CacheCollector:
    """The exact-answer cache in /metrics: `basal_answer_cache_{hits,misses,bypasses,evictions,expirations}_total`,
    `basal_answer_cache_{entries,bytes}`."""
    counters = {
        "hits_total": "requests answered from the exact-answer cache",
        "misses_total": "requests looked up and not found (computed, then kept)",
        "bypasses_total": "requests that asked not to be answered from it (Cache-Control: no-cache)",
        "evictions_total": "answers pushed out by the entry or byte bound",
        "expirations_total": "answers found older than answer_cache_ttl_s",
    }
    sizes = {"entries": "answers kept", "bytes": "bytes of the answers kept (their encoded bodies)"}

    def read():
        c = cache.counts
        yield (), {
            "hits_total": c.hits, "misses_total": c.misses, "bypasses_total": c.bypasses,
            "evictions_total": c.evictions, "expirations_total": c.expirations,
            "entries": len(cache), "bytes": cache.bytes,
        }  # fmt: skip

    return CacheCollector("answer_cache", (), counters, sizes, read)


STATE_CACHE_SERIES = {
    "hits_total": "states found computed when their pass was packed",
    "partial_hits_total": "states extending a computed one (only the new tokens computed)",
    "misses_total": "states computed from the template prefix",
    "evictions_total": "states pushed out by the state_cache_mb budget (least recently used first)",
    "computed_tokens_total": "tokens computed to fill state cache entries",
}
STATE_CACHE_SIZES = {
    "entries": "states kept",
    "bytes": "bytes of the K/V the backend holds for them",
    "budget_bytes": "state_cache_mb in bytes",
}


def state_cache_series(engines: Engines) -> CacheCollector:
    """The state cache of every loaded model with one (`basal_state_cache_*{model}`), read at scrape time."""

    def read():
        for name, engine in list(engines.engines.items()):
            if engine.pipeline.state_cache is not None:
                yield (name,), engine.pipeline.state_cache.stats()

    return CacheCollector("state_cache", ("model",), STATE_CACHE_SERIES, STATE_CACHE_SIZES, read)


def metrics_listener(engines: EnginesFront, addr: str):
    """`/metrics` alone on its own address (a daemon thread), for a scrape network apart from the API's; it asks
    for no key, so bind it to an interface only Prometheus reaches."""
    from prometheus_client import start_http_server

    host, _, port = addr.rpartition(":")
    check_port(host.strip("[]"), int(port))
    server, _thread = start_http_server(int(port), host.strip("[]"), registry=engines.metrics.registry)
    log.info("metrics on http://%s/metrics (no API key there)", addr)
    return server  # `shutdown()` stops it (tests); `basal serve` lets it end with the process


def batch_settings(config: ServeConfig) -> BatchSettings:
    """The Batch API's limits and store directory, from `batches:`."""
    b = config.batches
    retention = None if b.retention_days == 0 else int(b.retention_days * 86400)
    return BatchSettings(
        root=Path(b.dir).expanduser() if b.dir else cache_dir() / "batches",
        max_upload_bytes=int(b.max_upload_mb * 1_000_000),
        max_lines=b.max_lines,
        max_line_bytes=b.max_line_kb << 10,
        max_active=b.max_in_progress,
        output_retention_s=retention,
        batch_retention_s=retention,
        database=None if b.database in (None, "sqlite") else b.database,
        lease_s=b.lease_s,
    )


def batch_service(config: ServeConfig, ray: bool = False) -> BatchService | None:
    """The Files and Batches API's store and runner, when `batches` is on (docs/batches.md). Behind the Ray front
    (`ray`) fewer lines are in flight at once: each holds one of a replica's `max_ongoing_requests` places, and
    online requests must find places free."""
    if not config.batches_enabled:
        return None
    settings = batch_settings(config)
    if ray:
        settings = dataclasses.replace(settings, window=RAY_WINDOW)
    where = f"PostgreSQL at {redact(settings.database)}, files in" if settings.database else "store in"
    log.info("batches: the Files and Batches API is on, its %s %s", where, settings.root)
    return BatchService(open_store(settings.root, settings.database), settings)


def serve(config: ServeConfig) -> None:
    """Listen first, then load: probes get answers during a long load (`/health/live` 200, `/health/ready` 503 with
    each model's step) instead of "connection refused". A load that fails stops the server and raises here."""
    settings = api_settings(config)  # what the listener needs, built before anything is written or loaded
    check_port(config.host, config.port)  # before loading: a busy port costs a second, not the load
    if config.metrics_addr:
        host, _, port = config.metrics_addr.rpartition(":")
        check_port(host.strip("[]"), int(port))
    engines, sources = pending_engines(config)  # directories and names: a bad path fails before the listener opens
    calibrations = {d.name: d.calibration.thresholds for _, d in sources}  # read before any weights load
    front = with_cascades(engines, config, calibrations.__getitem__)
    failed: list[BaseException] = []
    server = _server(front, config, batches=batch_service(config), settings=settings)

    def load() -> None:
        try:
            load_models(engines, sources, config, progress=True)
        except BaseException as e:  # the server stops; `serve` raises it once uvicorn has shut down
            failed.append(e)
            server.should_exit = True
            return
        log.debug("%d objects of start-up frozen out of the cycle collector", freeze_startup_heap())

    loader = threading.Thread(target=load, name="basal-load", daemon=True)
    forget = forget_calibrations(settings, server.engines)
    reload_on_sighup(engines, {model.name: spec for spec, model in sources}, on_change=forget)
    loader.start()
    server.run()
    if failed:
        raise failed[0]


def forget_calibrations(settings: ApiSettings, front: EnginesFront) -> Callable[[], None]:
    """What a reload that changed a calibration must forget: the answer cache's answers (the old calibration's),
    and what the served front's wrappers read from a calibration: the drift series' and the cascades' thresholds."""
    cache = settings.answer_cache

    def forget() -> None:
        if cache is not None:
            cache.clear()
        if isinstance(front, WrappedFront):
            front.forget_calibrations()

    return forget


def listen(
    engines: EnginesFront,
    config: ServeConfig,
    where: str = "",
    batches: BatchService | None = None,
    settings: ApiSettings | None = None,
    built: Callable[[DrainingServer], None] | None = None,
) -> None:
    """The HTTP front around loaded engines (one process's, or the Ray front's), until shutdown. `settings`: built
    by the caller when it keeps a hand on them; `built` sees the server before it runs (the Ray front hands a
    reload what it must forget: `forget_calibrations` of the served front)."""
    server = _server(with_cascades(engines, config), config, where, batches, settings)
    if built is not None:
        built(server)
    log.debug("%d objects of start-up frozen out of the cycle collector", freeze_startup_heap())
    server.run()


def cascades_of(config: ServeConfig) -> list[Cascade]:
    """The configuration's cascades as the front serves them."""
    return [Cascade(c.name, tuple(Step(s.model, _rule(s)) for s in c.steps)) for c in config.cascades]


def _rule(step: CascadeStepConfig) -> Rule | None:
    kind, value = (
        ("confidence", step.escalate_below) if step.escalate_below is not None else ("error", step.escalate_above_error)
    )
    if value is None:
        return None
    if isinstance(value, dict):
        return Rule(kind, None, dict(value))
    return Rule(kind, float(value))


def with_cascades(
    engines: EnginesFront, config: ServeConfig, thresholds_of: Callable[[str], Mapping[str, Any]] | None = None
) -> EnginesFront:
    """The front that also serves the configuration's cascades (the engines themselves when there are none).
    `thresholds_of`: a model's certified thresholds, when known before its weights load."""
    if not config.cascades:
        return engines
    try:
        front = CascadeFront(engines, cascades_of(config))
        for cascade in front.cascades.values():
            check_thresholds(cascade, thresholds_of or front.thresholds)
    except CascadeError as e:
        raise ConfigError(f"cascades: {e}") from e
    return front


def with_shadows(engines: EnginesFront, config: ServeConfig) -> ShadowFront | None:
    """The front that copies a sample of each shadowed model's requests to its shadow (None: no model has one).
    `models[i]` is served as `engines.names[i]` (the served names are in configuration order)."""
    shadows = [
        Shadow(engines.names[i], m.shadow.model, m.shadow.sample, m.shadow.queue)
        for i, m in enumerate(config.models)
        if m.shadow is not None
    ]
    if not shadows:
        return None
    try:
        return ShadowFront(engines, shadows)
    except ValueError as e:
        raise ConfigError(f"models: {e}") from e


def pinned_set(engines: EnginesFront, config: ServeConfig, settings: ApiSettings) -> tuple[list, list]:
    """The app's start-up and shutdown hooks that run `drift_set` every `drift_interval_s` (none without one)."""
    if config.drift_set is None:
        return [], []
    from basal.api.decide import body_decider
    from basal.core.request.model_names import model_resolver
    from basal.replay.pinned import PinnedSet

    try:
        where = config.drift_reference_dir
        references = Path(where).expanduser() if where else cache_dir() / "drift"
        resolve = model_resolver(engines.names, engines.default)
        pinned = PinnedSet(
            Path(config.drift_set), body_decider(engines, settings), engines.metrics, references, resolve
        )
    except ValueError as e:
        raise ConfigError(f"drift_set: {e}") from e
    start, stop = pinned.starter(config.drift_interval_s)
    return [start], [stop]


def _server(
    engines: EnginesFront,
    config: ServeConfig,
    where: str = "",
    batches: BatchService | None = None,
    settings: ApiSettings | None = None,
) -> DrainingServer:
    from basal.api.app import create_app  # the web stack, imported only by what listens (`run-batch` does not)
    from basal.api.http.listener import DrainingServer, server_config

    settings = settings or api_settings(config)
    for warning in exposure_warnings(config, settings):
        log.warning(warning)
    shadow = with_shadows(engines, config)
    engines = with_drift(shadow or engines, config.drift_max_questions, config.drift_max_labels)
    if settings.answer_cache is not None:
        engines.metrics.add_collector(answer_cache_series(settings.answer_cache))
    starts, stops = pinned_set(engines, config, settings)
    app = create_app(engines, settings, batches=batches, shadow=shadow, on_startup=starts, on_shutdown=stops)
    log.info(
        "basal listening on http://%s:%d (models: %s; default %s)%s; the playground: http://%s:%d/playground",
        config.host,
        config.port,
        ", ".join(engines.names),
        engines.default,
        where,
        config.host,
        config.port,
    )
    if config.metrics_addr:
        metrics_listener(engines, config.metrics_addr)
    # basal writes the access log itself (basal.access, with the request id); uvicorn's loggers reach the root's
    # handler in the process's format (log_config=None)
    uvicorn_config = server_config(
        app, config.host, config.port, config.limits, access_log=False, log_level="info", log_config=None
    )
    return DrainingServer(uvicorn_config, engines, config.shutdown_grace_s)
