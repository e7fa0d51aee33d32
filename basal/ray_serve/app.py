"""Deploying basal on Ray Serve: one deployment (and application) per model, and the HTTP front that calls them.

    basal serve --ray [ADDRESS] --replicas N      the front runs here; replicas on the cluster (local if no address)
    serve deploy examples/ray/serve.yml           replicas deployed with Ray's own tooling (`replicas` builder);
                                                  then `basal serve --ray auto --config ...` attaches a front

The front is the same Litestar app as `basal serve` (both dialects, models, health, metrics, errors, headers)
around `RayEngines`; every model deployment runs `BasalReplica` with the state-affinity router.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from basal.ray_serve.ingress import RayEngines
from basal.ray_serve.replica import BasalReplica
from basal.serve.config import ModelConfig, RayConfig, ServeConfig, load_config

log = logging.getLogger("basal")

ROUTER_CLASS = "basal.ray_serve.router:StateAffinityRouter"


def model_names(config: ServeConfig) -> list[str]:
    """Served names of the configured models (the demo model when none), read from their directories."""
    from basal.core.model.synth import demo_model
    from basal.serve.server import model_directory

    if not config.models:
        return [demo_model().name]
    return [model_directory(spec).name for spec in config.models]


def app_name(model: str) -> str:
    return f"basal-{model}"


def model_deployment(config: ServeConfig, spec: ModelConfig | None, model: str):
    """The Ray Serve application of one model: `BasalReplica` with its resources, replicas and router."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    ray = config.ray or RayConfig()
    single = msgspec.structs.replace(config, models=[spec] if spec else [], ray=None)
    options: dict[str, Any] = {
        "name": app_name(model),
        "max_ongoing_requests": ray.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": ray.num_cpus, "num_gpus": ray.num_gpus},
        "health_check_period_s": 5,
    }
    if ray.autoscaling is not None:
        options["autoscaling_config"] = msgspec.to_builtins(ray.autoscaling)
    else:
        options["num_replicas"] = ray.replicas
    if ray.router == "affinity":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=ROUTER_CLASS, request_router_kwargs={"max_queue": ray.router_max_queue}
        )
    return serve.deployment(BasalReplica).options(**options).bind(msgspec.to_builtins(single))


def replicas(args: dict[str, str]):
    """`serve run`/`serve deploy` builder: the replicas of the first model of the YAML config in `args["config"]`
    (deploy one application per model by listing it once per model with `args.model`)."""
    config = load_config(args["config"])
    names = model_names(config)
    index = names.index(args["model"]) if "model" in args else 0
    spec = config.models[index] if config.models else None
    return model_deployment(config, spec, names[index])


def start(config: ServeConfig) -> RayEngines:
    """Connect to (or start) Ray, deploy every model that is not deployed yet, and return the front's engines."""
    import ray
    from ray import serve

    ray_cfg = config.ray or RayConfig()
    local = {"include_dashboard": False} if ray_cfg.address is None else {}  # a local Ray starts faster without it
    ray.init(address=ray_cfg.address, ignore_reinit_error=True, log_to_driver=False, **local)
    serve.start(proxy_location="Disabled")
    names = model_names(config)
    running = serve.status().applications
    handles = {}
    for i, name in enumerate(names):
        if app_name(name) not in running:
            spec = config.models[i] if config.models else None
            log.info("deploying %s on Ray Serve", name)
            serve.run(model_deployment(config, spec, name), name=app_name(name), route_prefix=None)
        handles[name] = serve.get_deployment_handle(app_name(name), app_name=app_name(name))
    infos = {name: handle.model_info.remote().result() for name, handle in handles.items()}
    default = config.default_model or names[0]
    return RayEngines(handles, infos, default, config.max_inflight, ray_cfg.affinity_min_chars, _ready_check(names))


def _ready_check(names: list[str], every_s: float = 1.0):
    """/health/ready's readiness on Ray: every model has a RUNNING replica (asked of the Serve controller at most once
    a second). Not the application's status: it leaves RUNNING while one of two replicas is replaced, although the
    other answers every request (the front retries a call that hit the dead one)."""
    state = {"at": float("-inf"), "ready": False}

    def serving(app: Any) -> bool:
        return all(d.replica_states.get("RUNNING", 0) > 0 for d in app.deployments.values())

    def ready() -> bool:
        from ray import serve

        if time.monotonic() - state["at"] >= every_s:
            apps = serve.status().applications
            state["ready"] = all(app_name(n) in apps and serving(apps[app_name(n)]) for n in names)
            state["at"] = time.monotonic()
        return bool(state["ready"])

    return ready


def running_replicas(names: list[str]) -> dict[str, int]:
    """Application -> replicas RUNNING, of these models' applications (asked of the Serve controller)."""
    from ray import serve

    apps = serve.status().applications
    return {
        app_name(n): sum(d.replica_states.get("RUNNING", 0) for d in apps[app_name(n)].deployments.values())
        for n in names
        if app_name(n) in apps
    }


def follow_reloads(engines: RayEngines, on_change: Callable[[], None]):
    """SIGHUP to this front reloads every replica's calibration; this front (and any other) then announces the new
    one and calls `on_change` (`basal.ray_serve.reload`). -> an event that stops the following."""
    from basal.ray_serve.reload import front_watch, reload_on_sighup

    names = list(engines.names)
    stop = front_watch(lambda: running_replicas(names), engines.refresh, on_change)
    reload_on_sighup()
    return stop


def serve_ray(config: ServeConfig) -> None:
    """`basal serve --ray`: the HTTP front here, the engines on Ray; a local Ray is shut down on exit."""
    from ray import serve

    from basal.serve.port_check import check_port
    from basal.serve.server import api_settings, batch_service, forget_calibrations, listen

    check_port(config.host, config.port)  # before Ray starts and the replicas load
    engines = start(config)
    settings = api_settings(config)
    forgets: list[Callable[[], None]] = []  # the served front's answer cache and drift thresholds, once it is built
    stop = follow_reloads(engines, lambda: [forget() for forget in forgets])
    try:
        # the front owns the batch store; lines go to the replicas through the router, as online requests do
        listen(
            engines,
            config,
            "; replicas on Ray Serve",
            batches=batch_service(config, ray=True),
            settings=settings,
            built=lambda server: forgets.append(forget_calibrations(settings, server.engines)),
        )
    finally:
        stop.set()
        if (config.ray or RayConfig()).address is None:
            serve.shutdown()
