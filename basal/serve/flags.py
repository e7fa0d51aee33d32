"""`basal serve`'s flags and how they combine with `--config FILE`.

Precedence, key by key (docs/configuration.md): a flag given on the command line > the key in the configuration file >
the environment (`BASAL_<KEY>`) > the default the schema declares (`basal.serve.config`). So every flag defaults to None
here ("not given"), and its help shows the schema's default, read from the schema so the two cannot drift.
Model flags (`--dtype`, `--schedule`, ...) apply to every model of the file; `--model` replaces the file's models.
"""

from __future__ import annotations

import argparse
import os

from basal.core.request.limits import Limits
from basal.serve.config import (
    DEMO_PATH,
    ModelConfig,
    ServeConfig,
    cascade_entry,
    environment,
    model_entry,
    parse_config,
    read_config_file,
)
from basal.serve.config_keys import default_of, enum_values

# key -> (value type, help); the default is appended from the schema
SERVER_FLAGS: dict[str, tuple[type, str]] = {
    "addr": (str, "HOST:PORT to listen on"),
    "max_inflight": (int, "waiting + running requests over all models before HTTP 529"),
    "long_slice_ms": (float, "ms the long lane may hold the device while a main lane waits, then it steps aside"),
    "long_share": (float, "least share of device time the long lane gets while short requests keep coming; 0: none"),
    "release_date": (str, "release_date reported by /v1/models"),
    "max_body_mb": (float, "largest request body in MiB, compressed and decompressed (HTTP 413 beyond)"),
    "shutdown_grace_s": (float, "on SIGTERM, seconds requests in flight may finish before they get HTTP 503"),
    "threads": (int, "CPU forward threads (default: the physical cores)"),
    "metrics_addr": (str, "HOST:PORT of a separate listener for /metrics alone, without the API key (default: none)"),
    "otlp_endpoint": (str, "send OpenTelemetry traces over OTLP/HTTP here (needs the otel extra) (default: none, off)"),
    "answer_cache_entries": (int, "answers the exact-answer cache keeps (0: off)"),
    "answer_cache_mb": (float, "MiB of answers the exact-answer cache may hold"),
    "answer_cache_ttl_s": (float, "seconds an answer is served again from the cache"),
}
SWITCHES: dict[str, str] = {
    "metrics": "serve Prometheus metrics at /metrics",
    "access_log": "log one line per request",
    "public_metrics_and_schema": "with API keys: serve /metrics and /schema without one",
    "caches_shared": "with API keys: answer and state caches shared by all keys (a hit's speed tells others' asks)",
    "batches_shared": "with API keys: every key sees every file and batch (else each key only its own)",
}
MODEL_FLAGS: dict[str, str] = {
    "backend": "auto: CUDA -> torch, Apple Silicon -> mlx, else torch on the CPU",
    "dtype": "weights and activations (default: f16 on CUDA and Metal, f32 on the CPU)",
    "max_batch_tokens": "packed tokens per forward pass",
    "schedule": "queue order: hrrn (highest response ratio next) or fifo",
    "long_tokens": "requests over this many packed tokens go to the long lane; 0: no long lane",
    "tree_max_tokens": "tokens per packed row of the prefix tree",
    "large_choice": "choices with 11..255 options: group rounds in one option order (luce2-1o) or both (luce2)",
    "state_cache_mb": "MiB of states' K/V kept across requests (the state cache; 0: off)",
}
LIMIT_HELP: dict[str, str] = {
    "max_questions": "questions per request",
    "max_request_tokens": "packed tokens one request may compute (shared prefixes once)",
    "max_request_chars": "characters of all prompts of one request, checked before tokenizing",
    "max_prompt_chars": "characters of one prompt before tokenizing; 0: what the model's context can hold",
    "max_errors": "errors listed in one 422",
    "max_echo_chars": "characters of the request quoted in an error",
    "max_connections": "open HTTP connections (more are answered 503 and closed)",
    "max_header_count": "header lines of one request (431 beyond)",
    "max_header_bytes": "bytes of the request line and headers (431 beyond)",
    "header_timeout_s": "seconds from connecting to the end of the headers (408 beyond)",
    "body_timeout_s": "seconds from the headers' end to the body's end, an upload's between two reads (408 beyond)",
    "max_transit_bytes": "bytes of request bodies being received at once, over all connections (529 beyond)",
    "keep_alive_s": "seconds an idle kept-alive connection stays open",
}


CHOICE_FLAGS: dict[str, str] = {"log_format": "log lines as text or one JSON object per line"}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def shown_default(value: object) -> str:
    """A default as help text shows it: on/off, 100 rather than 100.0."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _with_default(text: str, struct: type, key: str) -> str:
    return text if "default" in text else f"{text} (default {shown_default(default_of(struct, key))})"


def add_serve_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML configuration (several models, every key); flags given beside it override its keys "
        "(default: $BASAL_CONFIG, else none)",
    )
    v.add_argument(
        "--model",
        default=None,
        metavar="DIR|OWNER/NAME[@REV]",
        help=f"model directory, {DEMO_PATH} (the built-in demo model), or a Hugging Face repo id (from the hub "
        "cache, else downloaded); replaces the models of --config (default: the file's models, else $BASAL_MODEL, "
        "else the demo model)",
    )
    for key, (kind, text) in SERVER_FLAGS.items():
        v.add_argument(_flag(key), type=kind, default=None, help=_with_default(text, ServeConfig, key))
    for key, text in SWITCHES.items():
        v.add_argument(
            _flag(key), action=argparse.BooleanOptionalAction, default=None, help=_with_default(text, ServeConfig, key)
        )
    for key, text in CHOICE_FLAGS.items():
        v.add_argument(
            _flag(key), choices=enum_values(ServeConfig, key), default=None, help=_with_default(text, ServeConfig, key)
        )
    for key, text in MODEL_FLAGS.items():
        default = default_of(ModelConfig, key)
        try:
            choices = enum_values(ModelConfig, key)
        except AssertionError:
            choices = None
        v.add_argument(
            _flag(key),
            type=None if choices else type(default),
            choices=choices,
            default=None,
            help=_with_default(text, ModelConfig, key),
        )
    v.add_argument(
        "--no-prefix-cache",
        action="store_true",
        default=None,
        help="do not cache the template prefix K/V (default: cached)",
    )
    v.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require this bearer key (repeatable; replaces the file's api_keys; env BASAL_API_KEYS=a,b adds keys; "
        "default: none, no authentication)",
    )
    v.add_argument(
        "--admin-api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="a bearer key that also sees every key's files and batches (repeatable; replaces the file's "
        "admin_api_keys; default: none)",
    )
    v.add_argument(
        "--no-auth",
        action="store_true",
        default=None,
        help="serve without API keys on purpose: an empty BASAL_API_KEYS is then no error (refused beside keys) "
        "(default: off)",
    )
    v.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="allow this browser origin (repeatable; replaces the file's cors_origins; default: none, CORS off)",
    )
    for key, text in LIMIT_HELP.items():  # every limit of docs/configuration.md's "Limits" table
        default = default_of(Limits, key)
        v.add_argument(_flag(key), type=type(default), default=None, help=_with_default(text, Limits, key))
    v.add_argument(
        "--cascade",
        action="append",
        default=None,
        metavar="NAME=MODEL:below=P,...,MODEL",
        help="serve NAME as a cascade of served models: each step's questions below confidence P "
        "(`below=0.9`) or below the certified threshold of an error target (`error=0.05`) go on to the next model, "
        "the last answers the rest; repeatable; replaces the file's cascades (default: none)",
    )
    v.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="scale out on Ray Serve: start a local Ray, or join the cluster at ADDRESS (auto, ray://HOST:10001) "
        "(default: no Ray, one process)",
    )
    v.add_argument(
        "--replicas", type=int, default=None, help="with --ray: engine replicas per model (default 2, or ray.replicas)"
    )


def serve_config(a: argparse.Namespace) -> ServeConfig:
    """The file's keys with the flags given laid over them, validated once (errors name the key and its source)."""
    config_file = a.config or os.environ.get("BASAL_CONFIG") or None
    data = read_config_file(config_file) if config_file else {}
    server = {k: getattr(a, k) for k in (*SERVER_FLAGS, *SWITCHES, *CHOICE_FLAGS) if getattr(a, k) is not None}
    if a.api_key is not None:
        server["api_keys"] = a.api_key
    if a.admin_api_key is not None:
        server["admin_api_keys"] = a.admin_api_key
    if a.cors_origin is not None:
        server["cors_origins"] = a.cors_origin
    if a.cascade is not None:
        server["cascades"] = [cascade_entry(text) for text in a.cascade]
    if a.no_auth:
        server["no_auth"] = True
    model = {k: getattr(a, k) for k in MODEL_FLAGS if getattr(a, k) is not None}
    if a.no_prefix_cache:
        model["no_prefix_cache"] = True
    limits = {k: getattr(a, k) for k in LIMIT_HELP if getattr(a, k) is not None}
    if a.model is not None:
        data["models"] = [model_entry(a.model)]
    elif "models" not in data and (env_models := environment()[0].get("models")):
        data["models"] = env_models  # before the model flags, which apply to every model wherever it comes from
    if model:
        entries = data.get("models") or [{"path": DEMO_PATH}]
        if isinstance(entries, list):  # any other shape is the schema's to report
            data["models"] = [{**m, **model} if isinstance(m, dict) else m for m in entries]
    data.update(server)
    if limits:
        data["limits"] = {**(data.get("limits") or {}), **limits}
    flags_given = bool(server or model or limits or a.model is not None)
    where = config_file or ("flags" if flags_given else "the environment")
    if config_file and flags_given:
        where = f"{config_file} with the flags given"
    return parse_config(data, where)
