"""Server configuration: one YAML file (`basal serve --config FILE`), flags, the environment, or all of them.

Precedence, key by key (docs/configuration.md): explicit flags > the configuration file > the environment (every
key as `BASAL_<KEY>`, `config_keys.environment_tree`) > the defaults declared below. Every unknown key and bad enum
value is reported at once, each with the nearest valid one (`config_keys.problems`). Validated once here, at the
edge; nothing deeper reads the environment or a raw dict."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from basal.core.engine.gate import DEFAULT_LONG_SHARE
from basal.core.request.limits import Limits
from basal.serve.config_keys import ENV_PREFIX, ENV_SEP, environment_tree, problems
from basal.serve.config_values import ApiKey, DatabaseUrl, HostPort, IsoDate

log = logging.getLogger("basal")

API_KEYS_VAR = "BASAL_API_KEYS"  # adds keys to the file's (`environment_api_keys`)
ADMIN_KEYS_VAR = "BASAL_ADMIN_API_KEYS"  # `admin_api_keys`, as every key from the environment
UPLOAD_ROOM = 512 << 10  # an upload holds its line in progress and less than this more (api/http/multipart.py)
MAX_MB = 1 << 20  # sizes in MB (a body, an upload, a line) up to a TiB: more is no size this machine holds
DEMO_PATH = "demo"  # `path: demo` (or `--model demo`): the built-in synthetic demo model; `./demo` is a directory
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(@[\w./-]+)?")  # owner/name[@revision] of the Hugging Face hub
# BASAL_ variables that are not configuration keys: read elsewhere (basal.core.home, the CPU kernels), by the
# CLI (BASAL_CONFIG, BASAL_MODEL), by compose (BASAL_TARGET) or by the tests
NOT_KEYS = frozenset(
    {"BASAL_HOME", "BASAL_CPU_KERNELS", "BASAL_CONFIG", "BASAL_MODEL", "BASAL_TARGET", "BASAL_BACKGROUND_PROBE"}
)


class ShadowConfig(msgspec.Struct, forbid_unknown_fields=True):
    """A candidate model decided in the background beside this one on a sample of its online requests."""

    model: str  # a served name: the candidate
    sample: Annotated[float, Meta(ge=0, le=1)] = 0.1  # the share of online requests copied to it
    queue: Annotated[int, Meta(ge=1, le=1 << 20)] = 64  # copies waiting or running at once; more are dropped


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True):
    path: str | None = None  # a local model directory, or "demo": the built-in demo model
    repo: str | None = None  # a Hugging Face repository (downloaded at start; needs the network)
    revision: str | None = None
    name: str | None = None  # the served name (default: basal.json's name); serves one directory twice
    dtype: Literal["f32", "f16", "bf16"] | None = None  # default: f16 on CUDA and Metal, f32 on the CPU
    backend: Literal["auto", "torch", "mlx"] = "auto"
    max_batch_tokens: Annotated[int, Meta(ge=1)] = 8192
    schedule: Literal["hrrn", "fifo"] = "hrrn"
    long_tokens: int = 4096  # 0: no long lane
    tree_max_tokens: Annotated[int, Meta(ge=1)] = 32768
    no_prefix_cache: bool = False
    # the cross-request state cache (docs/caches.md), MiB of states' K/V; 0: off
    state_cache_mb: Annotated[float, Meta(ge=0, le=MAX_MB)] = 1024.0
    gemm_table: str | None = None  # accepted for basal-rs configs; basal needs no GEMM table
    large_choice: Literal["luce2-1o", "luce2"] = "luce2-1o"  # choices with 11..255 options: groups in 1 or 2 orders
    shadow: ShadowConfig | None = None  # a candidate decided beside this model on a sample of its requests
    calibration: str | None = None  # a calibration file to serve (default: CALIBRATION.custom.json, else .json)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.repo is None):
            raise msgspec.ValidationError("a model needs exactly one of `path` or `repo`")
        if self.gemm_table not in (None, "none", "auto"):
            raise msgspec.ValidationError(
                "`gemm_table`: basal needs no GEMM table (its kernels run fixed shapes); remove the key"
            )
        if self.name is not None and not self.name.strip():
            raise msgspec.ValidationError("`name` must not be empty (leave it out to use basal.json's name)")

    @property
    def is_demo(self) -> bool:
        return self.path == DEMO_PATH


class AutoscalingConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Ray Serve autoscaling of a model's replicas on ongoing requests per replica."""

    min_replicas: int = 1
    max_replicas: Annotated[int, Meta(ge=1, le=4096)] = 4
    target_ongoing_requests: Annotated[float, Meta(gt=0)] = 16.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise msgspec.ValidationError("`autoscaling`: need 0 <= min_replicas <= max_replicas and max_replicas >= 1")


class RayConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Scale-out on Ray Serve (`basal serve --ray`): per model `replicas` engines behind the state-affinity router."""

    address: str | None = None  # None: start a local Ray; "auto" or "ray://HOST:10001": join a running cluster
    replicas: Annotated[int, Meta(ge=1, le=4096)] = 2  # per model (ignored with autoscaling)
    num_cpus: float = 1.0  # resources of one replica
    num_gpus: float = 0.0  # 1 on a GPU host: one replica per GPU
    max_ongoing_requests: Annotated[int, Meta(ge=1)] = 256  # per replica; Ray holds further requests at the ingress
    router: Literal["affinity", "power_of_two"] = "affinity"  # power_of_two: Ray's default router (comparisons)
    router_max_queue: Annotated[int, Meta(ge=1)] = 8  # requests on a state's preferred replica before others spill
    affinity_min_chars: int = 256  # shorter states are not worth keeping together: least-loaded replica
    autoscaling: AutoscalingConfig | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_ongoing_requests < 1 or self.router_max_queue < 1:
            raise msgspec.ValidationError("`ray`: replicas, max_ongoing_requests and router_max_queue must be positive")


class BatchesConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The Files and Batches API (docs/batches.md): where its store lives and what it accepts."""

    enabled: bool | None = None  # None: on when `addr` is a loopback address, off otherwise
    dir: str | None = None  # the store's directory (default: $BASAL_HOME/batches)
    max_upload_mb: Annotated[float, Meta(ge=0.001, le=MAX_MB)] = 200.0  # one uploaded file (413 beyond)
    max_lines: Annotated[int, Meta(ge=1)] = 50_000  # lines of one input file (400 beyond)
    max_line_kb: Annotated[int, Meta(ge=1, le=MAX_MB << 10)] = 1024  # one input line; longer: an error record
    max_in_progress: Annotated[int, Meta(ge=1)] = 8  # batches not yet finished; one more is refused with 429
    # finished batches, and output files without their own expiry (0: forever); stored as seconds (SQLite's int64)
    retention_days: Annotated[float, Meta(ge=0, le=36_500)] = 30.0
    # None: SQLite in `dir`; postgresql://…: one store for several servers
    database: DatabaseUrl | None = None
    # a server's claim on a chunk of lines; a killed server's lapses after this
    lease_s: Annotated[float, Meta(ge=1, le=86_400)] = 30.0


class CascadeStepConfig(msgspec.Struct, forbid_unknown_fields=True):
    """One step of a cascade: a served model and when it sends a question on (every step but the last)."""

    model: str  # a served name (`models[].name`, or basal.json's name)
    escalate_below: float | dict[str, float] | None = None  # a confidence, or one per question type
    escalate_above_error: float | dict[str, float] | None = None  # a certified max_error target (CALIBRATION.json)

    def __post_init__(self) -> None:
        if self.escalate_below is not None and self.escalate_above_error is not None:
            raise msgspec.ValidationError("a cascade step takes `escalate_below` or `escalate_above_error`, not both")
        for key in ("escalate_below", "escalate_above_error"):
            value = getattr(self, key)
            values = value.items() if isinstance(value, dict) else [("", value)] if value is not None else []
            for qtype, v in values:
                if qtype and qtype not in CASCADE_TYPES:
                    raise msgspec.ValidationError(f"`{key}`: unknown question type {qtype!r}; types: {CASCADE_TYPES}")
                if not 0 < v <= 1 or v != v:
                    raise msgspec.ValidationError(f"`{key}` must be above 0 and at most 1, got {v!r}")


class CascadeConfig(msgspec.Struct, forbid_unknown_fields=True):
    """A served name answered by its first model, each uncertain question sent on to the next (docs/cascades.md)."""

    name: str
    steps: list[CascadeStepConfig]

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise msgspec.ValidationError("a cascade needs a `name`")
        if len(self.steps) < 2:
            raise msgspec.ValidationError(f"cascade {self.name!r}: needs at least two `steps`")
        for i, step in enumerate(self.steps):
            rule = step.escalate_below is not None or step.escalate_above_error is not None
            if rule == (i == len(self.steps) - 1):
                raise msgspec.ValidationError(
                    f"cascade {self.name!r}: every step but the last needs `escalate_below` or "
                    "`escalate_above_error`; the last answers what reaches it and has neither"
                )


CASCADE_TYPES = "choice, noul, score, multi, act"


class CaptureConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Request capture to JSONL in the Batch API's input format (docs/replay.md): personal data where states are."""

    path: str | None = None  # the file (rotated beside it as FILE.1, FILE.2, ...); None: no capture
    sample: Annotated[float, Meta(ge=0, le=1)] = 1.0  # the share of valid requests written
    max_mb: Annotated[float, Meta(ge=0.001, le=MAX_MB)] = 100.0  # a file this large is rotated
    keep: Annotated[int, Meta(ge=0, le=1000)] = 5  # rotated files kept
    hash_state: bool = False  # write the state's SHA-256 instead of its text (such lines cannot be replayed)


class ServeConfig(msgspec.Struct, forbid_unknown_fields=True):
    models: list[ModelConfig] = msgspec.field(default_factory=list)  # empty: the built-in demo model
    addr: HostPort = "127.0.0.1:8000"
    default_model: str | None = None  # /v1/basal requests without "model" (default: the first model)
    max_inflight: Annotated[int, Meta(ge=1)] = 1024
    long_slice_ms: Annotated[float, Meta(gt=0, le=60_000)] = 100.0  # a minute at most
    # the long lane's floor on device time while it has work (0: none)
    long_share: Annotated[float, Meta(ge=0, lt=1)] = DEFAULT_LONG_SHARE
    release_date: IsoDate = "2026-10-05"
    metrics: bool = False
    api_keys: list[ApiKey] = msgspec.field(default_factory=list)
    no_auth: bool = False  # no API keys on purpose: an empty BASAL_API_KEYS is then no error
    max_body_mb: Annotated[float, Meta(ge=0.001, le=MAX_MB)] = 16.0  # from a KB: less refuses every request
    access_log: bool = False
    gemm_cache: str | None = None  # accepted for basal-rs configs; unused
    limits: Limits = msgspec.field(default_factory=Limits)  # docs/configuration.md "Limits": what one request may cost
    cors_origins: list[str] = msgspec.field(default_factory=list)  # browser origins allowed (none: CORS off)
    shutdown_grace_s: Annotated[float, Meta(le=86_400)] = 30.0  # on SIGTERM: how long requests in flight may finish
    threads: Annotated[int, Meta(ge=1, le=4096)] | None = None  # CPU forward threads (default: the physical cores)
    ray: RayConfig | None = None  # scale out on Ray Serve (`basal serve --ray`)
    metrics_addr: HostPort | None = None  # a separate /metrics listener (no key there; bind it privately)
    public_metrics_and_schema: bool = False  # with api_keys: /metrics and /schema without a key (docs/operations.md)
    log_format: Literal["text", "json"] = "text"  # json: one object per line (time, level, logger, request_id, ...)
    otlp_endpoint: str | None = (
        None  # OpenTelemetry traces over OTLP/HTTP (the otel extra), e.g. http://h:4318/v1/traces
    )
    batches: BatchesConfig = msgspec.field(default_factory=BatchesConfig)  # the Files and Batches API
    cascades: list[CascadeConfig] = msgspec.field(default_factory=list)  # names answered by several models in turn
    capture: CaptureConfig = msgspec.field(default_factory=CaptureConfig)  # request capture (off without a path)
    answer_cache_entries: Annotated[int, Meta(ge=0, le=1 << 24)] = 4096  # the exact-answer cache: answers kept; 0: off
    answer_cache_mb: Annotated[float, Meta(ge=0.001, le=MAX_MB)] = 64.0  # the answers' bytes it may hold
    answer_cache_ttl_s: Annotated[float, Meta(gt=0, le=365 * 86_400)] = 600.0  # how long an answer is served again
    # drift series (docs/shadow.md "Drift"): question names per model and labels per question counted by name; the
    # rest under `_other` (both are user data: the bound keeps /metrics small); 0 questions: no drift series
    drift_max_questions: Annotated[int, Meta(ge=0, le=4096)] = 64
    drift_max_labels: Annotated[int, Meta(ge=1, le=1024)] = 16
    drift_set: str | None = None  # a pinned set (Batch API input JSONL or a capture) replayed to check the bits
    drift_interval_s: Annotated[float, Meta(ge=1, le=30 * 86_400)] = 3600.0  # between two runs of `drift_set`
    drift_reference_dir: str | None = None  # where `drift_set`'s reference is kept (None: $BASAL_HOME/drift)
    caches_shared: bool = False  # with api_keys: both caches shared by all keys (a hit's speed tells what others sent)
    admin_api_keys: list[ApiKey] = msgspec.field(default_factory=list)  # keys that also see every key's batches
    batches_shared: bool = False  # with api_keys: every key sees every file and batch (else each key its own)

    def __post_init__(self) -> None:
        if self.metrics_addr is not None and _same_listener(self.addr, self.metrics_addr):
            raise msgspec.ValidationError(
                f"`metrics_addr` {self.metrics_addr} is the API's own `addr` {self.addr}: the separate /metrics "
                "listener needs a port of its own (or leave `metrics_addr` out: /metrics is then on `addr`)"
            )
        if self.limits.max_transit_bytes < self.max_body_mb * (1 << 20):
            raise msgspec.ValidationError(
                f"`limits.max_transit_bytes` ({self.limits.max_transit_bytes}) is below `max_body_mb` "
                f"({self.max_body_mb:g} MiB): a body that large could never be received (529 every time); raise "
                "`max_transit_bytes` or lower `max_body_mb`"
            )
        upload_room = (self.batches.max_line_kb << 10) + UPLOAD_ROOM
        if self.batches.enabled is not False and self.limits.max_transit_bytes < upload_room:
            raise msgspec.ValidationError(
                f"`limits.max_transit_bytes` ({self.limits.max_transit_bytes}) is below what an upload holds while "
                f"it streams (`batches.max_line_kb` and {UPLOAD_ROOM >> 10} KiB, {upload_room} bytes): a file with "
                "a line that long could never be uploaded (529 every time); raise `max_transit_bytes` or lower "
                "`batches.max_line_kb`"
            )
        for name, keys in (("api_keys", self.api_keys), ("admin_api_keys", self.admin_api_keys)):
            if self.no_auth and keys:
                raise msgspec.ValidationError(
                    f"`no_auth` (--no-auth) says the server runs without API keys, but `{name}` gives "
                    f"{len(keys)}: remove one of the two"
                )
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
        return self.batches.enabled if self.batches.enabled is not None else is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a loopback address, or localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and says what to change."""


def _same_listener(addr: str, other: str) -> bool:
    """Whether two HOST:PORT would listen on one socket: the same port, and the same host or a wildcard."""
    host, _, port = addr.rpartition(":")
    other_host, _, other_port = other.rpartition(":")
    if port != other_port:
        return False
    hosts = {"127.0.0.1" if h == "localhost" else h.strip("[]") for h in (host, other_host)}
    return len(hosts) == 1 or bool(hosts & {"0.0.0.0", "::", ""})


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


@functools.cache
def _loader() -> type:
    """The YAML loader class, built at the first file read: PyYAML is imported only where a file is read (a start
    without one, `basal decide`, does not pay for it)."""
    import yaml

    class Loader(yaml.SafeLoader):
        """YAML as the configuration reads it: a key given twice is an error naming it and both lines (PyYAML keeps
        the last silently), and a date stays the text it was written as (`release_date: 2026-13-01` is then
        reported by the key's own rule, not as PyYAML's "month must be in 1..12")."""

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise ConfigError(
                        f"line {line}: the key `{key}` is given twice in one section (also on line {seen[key]}); "
                        "YAML would keep only the last: remove one"
                    )
                if isinstance(key, str | int | float | bool):
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {
        first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def read_config_file(path: str | Path) -> dict:
    """The YAML file as a dict (not validated yet: flags may still be laid over it)."""
    import yaml

    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_loader()) or {}  # a SafeLoader
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the configuration ({e})") from e
    except ConfigError as e:
        raise ConfigError(f"{path}, {e}") from None
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


def cascade_entry(text: str) -> dict[str, object]:
    """A `cascades:` entry from `--cascade NAME=MODEL:below=0.9,MODEL:error=0.05,MODEL`."""
    name, eq, chain = text.partition("=")
    if not eq or not name.strip() or not chain.strip():
        raise ConfigError(f"--cascade {text!r}: write NAME=MODEL:below=0.9,MODEL (a name, then its steps in order)")
    steps: list[dict[str, object]] = []
    for part in chain.split(","):
        model, _, rule = part.strip().partition(":")
        step: dict[str, object] = {"model": model.strip()}
        if rule:
            key, _, value = rule.partition("=")
            keys = {"below": "escalate_below", "error": "escalate_above_error"}
            try:
                step[keys[key.strip()]] = float(value)
            except (KeyError, ValueError):
                raise ConfigError(
                    f"--cascade {text!r}: step {part.strip()!r}: write MODEL:below=P (a confidence) or "
                    "MODEL:error=E (a certified max_error target)"
                ) from None
        steps.append(step)
    return {"name": name.strip(), "steps": steps}


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
    not fit its key is an error; a BASAL_ variable that names no key is a warning (with the nearest names).
    BASAL_API_KEYS (or BASAL_ADMIN_API_KEYS) set but without a key (`""`, `" , ,"`), and no key elsewhere, is an
    error unless `no_auth` says so: a deployment whose secret went missing must not start an open server."""
    environ = dict(os.environ if environ is None else environ)
    tree, bad, unknown = environment(environ)
    for problem in unknown:
        log.warning("%s (ignored; every key: docs/configuration.md)", problem)
    no_auth = data.get("no_auth", tree.get("no_auth", False))
    keyless = not environment_api_keys(environ) and not data.get("api_keys")  # the file's or the flags' keys
    keyless = keyless and not data.get("admin_api_keys") and not tree.get("admin_api_keys")
    for var in (API_KEYS_VAR, ADMIN_KEYS_VAR):
        if var in environ and keyless and not bad and no_auth is not True:
            bad.append(
                f"{var} is set but holds no key ({environ[var]!r}): give the keys (a,b), or say "
                "--no-auth (no_auth: true, BASAL_NO_AUTH=true) to serve without keys on purpose"
            )
    if bad:
        listed = bad[0] if len(bad) == 1 else f"{len(bad)} problems:" + "".join(f"\n  - {p}" for p in bad)
        raise ConfigError(f"the environment: {listed}\n(every key: docs/configuration.md)")
    return _under(data, tree)


def environment_api_keys(environ: Mapping[str, str] | None = None) -> list[str]:
    """The keys of BASAL_API_KEYS (comma-separated; accepted beside the file's `api_keys`)."""
    raw = (os.environ if environ is None else environ).get(API_KEYS_VAR, "")
    return [k for k in (k.strip() for k in raw.split(",")) if k]


def _under(data: dict, env: dict) -> dict:
    out = dict(data)
    for key, value in env.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = _under(out[key], value)
    return out


def parse_config(data: object, where: str = "configuration") -> ServeConfig:
    """Validate a raw tree; the environment (BASAL_*) fills only the keys it does not set. Every value is checked
    where it comes from (`where`, or the variable), so only rules between keys are left to the struct's own
    checks, whose message names both sources when the environment took part."""
    if isinstance(data, dict) and isinstance(data.get("release_date"), datetime.date):  # a date read by PyYAML
        data = {**data, "release_date": data["release_date"].isoformat()}
    if found := problems(data, ServeConfig):
        listed = found[0] if len(found) == 1 else f"{len(found)} problems:" + "".join(f"\n  - {p}" for p in found)
        raise ConfigError(f"{where}: {listed}\n(every key: docs/configuration.md)")
    merged = with_environment(data, where) if isinstance(data, dict) else data
    if merged != data and "environment" not in where:
        where = f"{where} with the environment (BASAL_*)"
    try:
        return msgspec.convert(merged, ServeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{where}: {e}{_variables_at(str(e))}") from e


def _variables_at(message: str) -> str:
    """The BASAL_* variables of the keys a struct's own check names in `message` (`` `state_cache_mb` ``), as
    " (the environment has BASAL_MODELS__0__STATE_CACHE_MB=...)": such a check sees the merged tree, so the
    message says where a value may have come from. "" when the environment has none of them."""
    keys = {k.upper() for k in re.findall(r"`([a-z_]+)`", message)}
    config_vars = [v for v in os.environ if v.startswith(ENV_PREFIX) and v not in NOT_KEYS]
    names = sorted(v for v in config_vars if v.removeprefix(ENV_PREFIX).rsplit(ENV_SEP, 1)[-1] in keys)
    shown = ", ".join(f"{v}={os.environ[v][:80]!r}" for v in names if v != API_KEYS_VAR)
    return f" (the environment has {shown})" if shown else ""
