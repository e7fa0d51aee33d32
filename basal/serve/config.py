"""Server configuration: one YAML file (`basal serve --config FILE`), flags, or both.

Precedence, key by key (docs/configuration.md): explicit flags > the configuration file > environment (`BASAL_ADDR`)
> the defaults declared below. Every unknown key and bad enum value is reported at once, each with the nearest
valid one (`config_keys.problems`). Validated once here, at the edge; nothing deeper reads the environment or a
raw dict.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Literal

import msgspec
import yaml

from basal.core.engine.gate import DEFAULT_LONG_SHARE
from basal.core.request.limits import Limits
from basal.serve.config_keys import problems

DEMO_PATH = "demo"  # `path: demo` (or `--model demo`): the built-in synthetic demo model; `./demo` is a directory


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
    state_cache_mb: int = 0  # accepted for basal-rs configs; only 0 (off) is supported
    gemm_table: str | None = None  # accepted for basal-rs configs; basal needs no GEMM table
    large_choice: Literal["luce2-1o", "luce2"] = "luce2-1o"  # choices with 11..255 options: groups in 1 or 2 orders

    def __post_init__(self) -> None:
        if (self.path is None) == (self.repo is None):
            raise msgspec.ValidationError("a model needs exactly one of `path` or `repo`")
        if self.state_cache_mb:
            raise msgspec.ValidationError("`state_cache_mb` (the cross-request state cache) is not supported; use 0")
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
    batches: BatchesConfig = msgspec.field(default_factory=BatchesConfig)  # the Files and Batches API

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


def parse_config(data: object, where: str = "configuration") -> ServeConfig:
    """Validate a raw tree; `BASAL_ADDR` applies only where neither the file nor a flag gave `addr`."""
    if found := problems(data, ServeConfig):
        listed = found[0] if len(found) == 1 else f"{len(found)} problems:" + "".join(f"\n  - {p}" for p in found)
        raise ConfigError(f"{where}: {listed}\n(every key: docs/configuration.md)")
    if isinstance(data, dict) and "addr" not in data and (env_addr := os.environ.get("BASAL_ADDR")):
        data = {**data, "addr": env_addr}
    if isinstance(data, dict) and isinstance(data.get("release_date"), datetime.date):  # YAML reads 2026-10-05 so
        data = {**data, "release_date": data["release_date"].isoformat()}
    try:
        return msgspec.convert(data, ServeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{where}: {e}") from e
