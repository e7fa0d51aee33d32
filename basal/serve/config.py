"""Server configuration: one YAML file (`basal serve --config FILE`), flags, the environment, or all of them.

Precedence, key by key (docs/configuration.md): explicit flags > the configuration file > the environment (every
key as `BASAL_<KEY>`, `config_keys.environment_tree`) > the defaults declared below. Every unknown key and bad enum
value is reported at once, each with the nearest valid one (`config_keys.problems`). Validated once here, at the
edge; nothing deeper reads the environment or a raw dict."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec
import yaml

from basal.core.engine.gate import DEFAULT_LONG_SHARE
from basal.core.request.limits import Limits
from basal.serve.config_keys import environment_tree, problems

log = logging.getLogger("basal")

DEMO_PATH = "demo"  # `path: demo` (or `--model demo`): the built-in synthetic demo model; `./demo` is a directory
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(@[\w./-]+)?")  # owner/name[@revision] of the Hugging Face hub
# BASAL_ variables that are not configuration keys: read elsewhere (basal.core.home, the CPU kernels), by the
# CLI (BASAL_CONFIG, BASAL_MODEL), by compose (BASAL_TARGET) or by the tests
NOT_KEYS = frozenset(
    {"BASAL_HOME", "BASAL_CPU_KERNELS", "BASAL_CONFIG", "BASAL_MODEL", "BASAL_TARGET", "BASAL_BACKGROUND_PROBE"}
)


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True):
    path: str | None = None  # a local model directory, or "demo": the built-in demo model
    repo: str | None = None  # a Hugging Face repository (downloaded at start; needs the network)
    revision: str | None = None
    name: str | None = None  # the served name (default: basal.json's name); serves one directory twice
    dtype: Literal["f32", "f16", "bf16"] | None = None  # default: f16 on CUDA and Metal, f32 on the CPU
    backend: Literal["auto", "torch", "mlx"] = "auto"
    max_batch_tokens: int = 8192
    schedule: Literal["hrrn", "fifo"] = "hrrn"
    long_tokens: int = 4096  # 0: no long lane
    tree_max_tokens: int = 32768
    no_prefix_cache: bool = False
    state_cache_mb: float = 1024.0  # the cross-request state cache (docs/caches.md), MiB of states' K/V; 0: off
    gemm_table: str | None = None  # accepted for basal-rs configs; basal needs no GEMM table
    large_choice: Literal["luce2-1o", "luce2"] = "luce2-1o"  # choices with 11..255 options: groups in 1 or 2 orders

    def __post_init__(self) -> None:
        if (self.path is None) == (self.repo is None):
            raise msgspec.ValidationError("a model needs exactly one of `path` or `repo`")
        if self.state_cache_mb < 0:
            raise msgspec.ValidationError("`state_cache_mb` must be 0 (off) or positive")
        if self.gemm_table not in (None, "none", "auto"):
            raise msgspec.ValidationError(
                "`gemm_table`: basal needs no GEMM table (its kernels run fixed shapes); remove the key"
            )
        for key in ("max_batch_tokens", "tree_max_tokens"):
            if getattr(self, key) < 1:
                raise msgspec.ValidationError(f"`{key}` must be positive")
        if self.long_tokens < 0:
            raise msgspec.ValidationError("`long_tokens` must be 0 (no long lane) or positive")
        if self.name is not None and not self.name.strip():
            raise msgspec.ValidationError("`name` must not be empty (leave it out to use basal.json's name)")

    @property
    def is_demo(self) -> bool:
        return self.path == DEMO_PATH


class AutoscalingConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Ray Serve autoscaling of a model's replicas on ongoing requests per replica."""

    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 16.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise msgspec.ValidationError("`autoscaling`: need 0 <= min_replicas <= max_replicas and max_replicas >= 1")


class RayConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Scale-out on Ray Serve (`basal serve --ray`): per model `replicas` engines behind the state-affinity router."""

    address: str | None = None  # None: start a local Ray; "auto" or "ray://HOST:10001": join a running cluster
    replicas: int = 2  # per model (ignored with autoscaling)
    num_cpus: float = 1.0  # resources of one replica
    num_gpus: float = 0.0  # 1 on a GPU host: one replica per GPU
    max_ongoing_requests: int = 256  # per replica; Ray holds further requests at the ingress
    router: Literal["affinity", "power_of_two"] = "affinity"  # power_of_two: Ray's default router (comparisons)
    router_max_queue: int = 8  # requests on a state's preferred replica before new ones spill over
    affinity_min_chars: int = 256  # shorter states are not worth keeping together: least-loaded replica
    autoscaling: AutoscalingConfig | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_ongoing_requests < 1 or self.router_max_queue < 1:
            raise msgspec.ValidationError("`ray`: replicas, max_ongoing_requests and router_max_queue must be positive")


class BatchesConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The Files and Batches API (docs/batches.md): where its store lives and what it accepts."""

    enabled: bool | None = None  # None: on when `addr` is a loopback address, off otherwise
    dir: str | None = None  # the store's directory (default: $BASAL_HOME/batches)
    max_upload_mb: float = 200.0  # one uploaded file (413 beyond)
    max_lines: int = 50_000  # lines of one input file (400 beyond)
    max_line_kb: int = 1024  # one input line; a longer line becomes an error record
    max_in_progress: int = 8  # batches not yet finished; one more is refused with 429
    retention_days: float = 30.0  # finished batches, and output files without their own expiry (0: forever)

    def __post_init__(self) -> None:
        for key in ("max_upload_mb", "max_lines", "max_line_kb", "max_in_progress"):
            if getattr(self, key) <= 0:
                raise msgspec.ValidationError(f"`batches.{key}` must be positive")
        if self.retention_days < 0:
            raise msgspec.ValidationError("`batches.retention_days` must be 0 (keep forever) or positive")


class ServeConfig(msgspec.Struct, forbid_unknown_fields=True):
    models: list[ModelConfig] = msgspec.field(default_factory=list)  # empty: the built-in demo model
    addr: str = "127.0.0.1:8000"
    default_model: str | None = None  # /v1/basal requests without "model" (default: the first model)
    max_inflight: int = 1024
    long_slice_ms: float = 100.0
    long_share: float = DEFAULT_LONG_SHARE  # the long lane's floor on device time while it has work (0: none)
    release_date: str = "2026-10-05"
    metrics: bool = False
    api_keys: list[str] = msgspec.field(default_factory=list)
    max_body_mb: float = 16.0
    access_log: bool = False
    gemm_cache: str | None = None  # accepted for basal-rs configs; unused
    limits: Limits = msgspec.field(default_factory=Limits)  # docs/configuration.md "Limits": what one request may cost
    cors_origins: list[str] = msgspec.field(default_factory=list)  # browser origins allowed (none: CORS off)
    shutdown_grace_s: float = 30.0  # on SIGTERM: how long requests in flight may finish (then 503)
    threads: int | None = None  # CPU forward threads (default: the physical cores)
    ray: RayConfig | None = None  # scale out on Ray Serve (`basal serve --ray`)
    metrics_addr: str | None = None  # HOST:PORT of a separate /metrics listener (no key there; bind it privately)
    public_metrics_and_schema: bool = False  # with api_keys: /metrics and /schema without a key (docs/operations.md)
    log_format: Literal["text", "json"] = "text"  # json: one object per line (time, level, logger, request_id, ...)
    otlp_endpoint: str | None = (
        None  # OpenTelemetry traces over OTLP/HTTP (the otel extra), e.g. http://h:4318/v1/traces
    )
    batches: BatchesConfig = msgspec.field(default_factory=BatchesConfig)  # the Files and Batches API
    answer_cache_entries: int = 4096  # the exact-answer cache (docs/caches.md): answers kept; 0: off
    answer_cache_mb: float = 64.0  # the answers' bytes it may hold
    answer_cache_ttl_s: float = 600.0  # how long an answer is served again
    caches_shared: bool = False  # with api_keys: both caches shared by all keys (a hit's speed tells what others sent)

    def __post_init__(self) -> None:
        host, _, port = self.addr.rpartition(":")
        if not host or not port.isdigit():
            raise msgspec.ValidationError(f"`addr` must be HOST:PORT, got {self.addr!r}")
        if self.max_inflight < 1:
            raise msgspec.ValidationError("`max_inflight` must be positive")
        if not 0 <= self.long_share < 1:
            raise msgspec.ValidationError("`long_share` must be at least 0 (no floor) and below 1")
        if self.shutdown_grace_s < 0:
            raise msgspec.ValidationError("`shutdown_grace_s` must be 0 or positive")
        if self.metrics_addr is not None:
            mhost, _, mport = self.metrics_addr.rpartition(":")
            if not mhost or not mport.isdigit():
                raise msgspec.ValidationError(f"`metrics_addr` must be HOST:PORT, got {self.metrics_addr!r}")
        if self.answer_cache_entries < 0 or self.answer_cache_mb <= 0 or self.answer_cache_ttl_s <= 0:
            raise msgspec.ValidationError(
                "`answer_cache_entries` must be 0 (off) or positive; `answer_cache_mb`, `answer_cache_ttl_s` positive"
            )
        if self.threads is not None and self.threads < 1:
            raise msgspec.ValidationError("`threads` must be positive (or left out: the physical cores)")
        _check_unique_names(self.models)

    @property
    def host(self) -> str:
        return self.addr.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.addr.rpartition(":")[2])

    @property
    def batches_enabled(self) -> bool:
        """`batches.enabled`, or by default: on when only this machine can reach the server."""
        if self.batches.enabled is not None:
            return self.batches.enabled
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and says what to change."""


def _check_unique_names(models: list[ModelConfig]) -> None:
    """Names given with `name:`, and one source given twice without one, must not collide (the rest is checked
    when the directories are read, before any weights load: `server.build_engines`)."""
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        key = f"name {m.name!r}" if m.name else f"{'path' if m.path else 'repo'} {m.path or m.repo!r}"
        if key in seen:
            raise msgspec.ValidationError(
                f"`models[{seen[key]}]` and `models[{i}]` would both be served as {key}; "
                "each served model needs its own name: give one of them a different `name:`"
            )
        seen[key] = i


def read_config_file(path: str | Path) -> dict:
    """The YAML file as a dict (not validated yet: flags may still be laid over it)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the configuration ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the configuration must be a YAML mapping of keys (see docs/configuration.md)")
    return data


def load_config(path: str | Path) -> ServeConfig:
    return parse_config(read_config_file(path), str(path))


def model_entry(text: str) -> dict[str, str]:
    """A `models:` entry from `--model` / BASAL_MODEL: a directory (or `demo`), else `owner/name[@revision]` of
    the Hugging Face hub (a directory of that name wins); anything else stays a path, whose error says it is
    missing."""
    if text == DEMO_PATH or Path(text).is_dir() or not HUB_ID.fullmatch(text):
        return {"path": text}
    repo, _, revision = text.partition("@")
    return {"repo": repo, "revision": revision} if revision else {"repo": repo}


def environment(environ: Mapping[str, str] | None = None) -> tuple[dict, list[str], list[str]]:
    """The configuration the BASAL_* variables give (`config_keys.environment_tree`), with BASAL_MODEL (a model
    as `--model` takes it) as `models` unless BASAL_MODELS__... are set."""
    environ = dict(os.environ if environ is None else environ)
    tree, bad, unknown = environment_tree(ServeConfig, environ, NOT_KEYS)
    if (model := environ.get("BASAL_MODEL", "").strip()) and "models" not in tree:
        tree["models"] = [model_entry(model)]
    return tree, bad, unknown


def with_environment(data: dict, where: str = "configuration", environ: Mapping[str, str] | None = None) -> dict:
    """`data` (the file with the flags laid over it) with the environment under it: a BASAL_* key applies only
    where `data` does not set that key; sections merge key by key, lists are replaced whole. A value that does
    not fit its key is an error; a BASAL_ variable that names no key is a warning (with the nearest names)."""
    tree, bad, unknown = environment(environ)
    for problem in unknown:
        log.warning("%s (ignored; every key: docs/configuration.md)", problem)
    if bad:
        listed = bad[0] if len(bad) == 1 else f"{len(bad)} problems:" + "".join(f"\n  - {p}" for p in bad)
        raise ConfigError(f"the environment: {listed}\n(every key: docs/configuration.md)")
    return _under(data, tree)


def _under(data: dict, env: dict) -> dict:
    out = dict(data)
    for key, value in env.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = _under(out[key], value)
    return out


def parse_config(data: object, where: str = "configuration") -> ServeConfig:
    """Validate a raw tree; the environment (BASAL_*) fills only the keys it does not set."""
    if found := problems(data, ServeConfig):
        listed = found[0] if len(found) == 1 else f"{len(found)} problems:" + "".join(f"\n  - {p}" for p in found)
        raise ConfigError(f"{where}: {listed}\n(every key: docs/configuration.md)")
    if isinstance(data, dict):
        data = with_environment(data, where)
    if isinstance(data, dict) and isinstance(data.get("release_date"), datetime.date):  # YAML reads 2026-10-05 so
        data = {**data, "release_date": data["release_date"].isoformat()}
    try:
        return msgspec.convert(data, ServeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{where}: {e}") from e
