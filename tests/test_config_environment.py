"""Every configuration key from the environment, generically: for each key of the schema (sections and lists of
sections included) a value from `BASAL_<KEY>` beats the default, the file's beats it, and the flag's (where the key
has one) beats both. The values are made from each key's type, so a key added to the schema is covered at once."""

from __future__ import annotations

import copy
import itertools
import os
import typing

import msgspec
import msgspec.inspect as mi
import pytest
import yaml

from basal.cli import build_parser
from basal.serve.config import NOT_KEYS, ConfigError, ServeConfig, parse_config
from basal.serve.config_keys import _literal_of, _struct_of, env_name, fields
from basal.serve.flags import LIMIT_HELP, MODEL_FLAGS, SERVER_FLAGS, SWITCHES, serve_config
from basal.serve.server import api_settings

# keys whose values are constrained beyond their type: three valid values (environment, file, flag)
CONSTRAINED = {
    "addr": ("127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"),
    "metrics_addr": ("127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103"),
    "long_share": (0.1, 0.2, 0.3),
    "gemm_table": ("none", "auto", "none"),
    "release_date": ("2026-01-02", "2026-03-04", "2026-05-06"),
    "sample": (0.2, 0.3, 0.4),  # a share (a shadow's, the capture's)
    "escalate_below": (0.5, 0.6, 0.7),  # a confidence
    "escalate_above_error": (0.01, 0.02, 0.1),  # an error target
    "database": ("sqlite", "postgresql://db/a", "postgresql://db/b"),
}
ONLY_DEFAULT: set[str] = set()  # keys accepted for old configs whose only valid value is the default (none now)


def leaves(struct: type[msgspec.Struct], path: tuple = ()):
    """(path, python type, default) of every key that holds a value; a list of sections is entered at index 0."""
    hints = typing.get_type_hints(struct)
    for name, f in fields(struct).items():
        listed = isinstance(f.type, mi.ListType)
        inner = _struct_of(f.type.item_type if listed else f.type)
        if inner is not None:
            yield from leaves(inner.cls, (*path, name, 0) if listed else (*path, name))
        else:
            if f.default is not msgspec.NODEFAULT:
                default = f.default
            else:  # a required key of an entry (a cascade's name): none until its entry is written
                default = f.default_factory() if f.default_factory is not msgspec.NODEFAULT else None
            yield (*path, name), f, hints[name], default


def three_values(key: str, f: mi.Field, hint, default) -> tuple:
    """Values for the environment, the file and a flag: each differs from the one it must beat."""
    if key in CONSTRAINED:
        return CONSTRAINED[key]
    choices = _literal_of(f.type)
    if choices is not None:
        others = [c for c in choices if c != default]
        return others[0], (others[1] if len(others) > 1 else default), others[0]
    kinds = set(typing.get_args(hint)) or {hint}
    if bool in kinds:
        return (not default, bool(default), not default)
    if int in kinds:
        return tuple((default or 0) + k for k in (2, 3, 4))
    if float in kinds:
        return tuple((default or 0.0) + k for k in (0.5, 1.5, 2.5))
    if isinstance(f.type, mi.ListType):
        return (["env-a", "env-b"], ["file-a"], ["flag-a"])
    return ("env-x", "file-x", "flag-x")


def as_env(value) -> str:
    return ",".join(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) else str(value)


def entry_context(path: tuple) -> dict:
    """What an entry needs beside the key at `path`, as a file's tree: a models entry its source (a repo where the
    key is `revision`) and a shadow its model; a cascade its name and two steps, the first with a rule."""
    if path[0] == "models" and path[2] not in ("path", "repo"):
        entry: dict = {"repo": "owner/name"} if path[2] == "revision" else {"path": "demo"}
        if path[2] == "shadow":
            entry["shadow"] = {"model": "other"}
        return {"models": [entry]}
    if path[0] == "cascades":
        # a step but the last needs one rule: the key under test when it is one, else a confidence
        rule = {path[-1]: 0.05} if path[-1].startswith("escalate") else {"escalate_below": 0.5}
        return {"cascades": [{"name": "c", "steps": [{"model": "a", **rule}, {"model": "b"}]}]}
    if path[0] == "batches" and path[1] == "database":
        return {}
    return {}


def nested(path: tuple, value, context: dict | None = None) -> dict:
    """The file's tree that sets `path`, inside the rest of its entry (`entry_context`)."""
    out = copy.deepcopy(context if context is not None else entry_context(path))
    node: typing.Any = out
    for part, after in itertools.pairwise(path):
        empty: typing.Any = [] if isinstance(after, int) else {}
        if isinstance(part, int):
            while len(node) <= part:
                node.append({})
            node = node[part]
        else:
            node = node.setdefault(part, empty)
    node[path[-1]] = value
    return out


def context_environment(context: dict | list, at: tuple = ()) -> dict[str, str]:
    """The `BASAL_*` variables that give the same tree as `context` (a list of sections by index)."""
    out: dict[str, str] = {}
    items = enumerate(context) if isinstance(context, list) else context.items()
    for key, value in items:
        if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
            out.update(context_environment(value, (*at, key)))
        else:
            out[env_name((*at, key))] = as_env(value)
    return out


def flag_argv(path: tuple, value) -> list[str] | None:
    """The flag that sets `path`, if there is one (`basal serve --help`)."""
    key = path[-1]
    name = "--" + key.replace("_", "-")
    if path == ("models", 0, "path"):
        return ["--model", value]
    if key in SWITCHES and len(path) == 1:
        return [name if value else f"--no-{key.replace('_', '-')}"]
    if (key in SERVER_FLAGS and len(path) == 1) or (path[0] == "limits" and key in LIMIT_HELP):
        return [name, str(value)]
    if path[0] == "models" and key in MODEL_FLAGS:
        return [name, str(value)]
    if (path[0] == "models" and key == "no_prefix_cache") or path == ("no_auth",):
        return [name] if value else None
    if path == ("api_keys",):
        return [arg for v in value for arg in ("--api-key", v)]
    if path == ("admin_api_keys",):
        return [arg for v in value for arg in ("--admin-api-key", v)]
    if path == ("cors_origins",):
        return [arg for v in value for arg in ("--cors-origin", v)]
    return None


def read(config: ServeConfig, path: tuple, missing=None):
    """The key's value; `missing` where its section or list entry is not there (no models, no `ray:`)."""
    value = config
    for part in path:
        if value is None or (isinstance(part, int) and len(value) <= part):
            return missing
        value = value[part] if isinstance(part, int) else getattr(value, part)
    return value


@pytest.fixture
def clean_environment(monkeypatch):
    for var in list(os.environ):
        if var.startswith("BASAL_") and var not in NOT_KEYS:
            monkeypatch.delenv(var)
    monkeypatch.delenv("BASAL_MODEL", raising=False)
    monkeypatch.delenv("BASAL_CONFIG", raising=False)
    return monkeypatch


KEYS = list(leaves(ServeConfig))
PARSER = build_parser()


def test_the_matrix_covers_every_key_of_the_schema():
    covered = {".".join(map(str, p)) for p, *_ in KEYS}
    assert {"addr", "max_inflight", "limits.max_questions", "models.0.path", "models.0.dtype", "ray.replicas",
            "ray.autoscaling.min_replicas", "api_keys", "threads"} <= covered  # fmt: skip
    assert len(covered) == len(KEYS) > 50


@pytest.mark.parametrize(("path", "f", "hint", "default"), KEYS, ids=[".".join(map(str, k[0])) for k in KEYS])
def test_flag_beats_file_beats_environment_beats_default(path, f, hint, default, clean_environment, tmp_path):
    monkeypatch = clean_environment
    var = env_name(path)
    model_var = env_name(("models", 0, "path"))
    key = path[-1]
    if key in ONLY_DEFAULT:
        monkeypatch.setenv(model_var, "demo")
        monkeypatch.setenv(var, "1")
        with pytest.raises(ConfigError, match=key):
            parse_config({})
        return
    env_value, file_value, flag_value = three_values(key, f, hint, default)
    context = entry_context(path)  # what the key's entry needs beside it, from the same place
    needed = context_environment(context)
    required = var in needed  # the entry cannot be without the key (a cascade's name, its first step's rule)
    for name, value in needed.items():
        if name != var or required:
            monkeypatch.setenv(name, value)

    def configured(*argv: str) -> ServeConfig:
        return serve_config(PARSER.parse_args(["serve", *argv]))

    if not required:
        assert read(configured(), path, default) == default  # nothing set: the schema's default
    monkeypatch.setenv(var, as_env(env_value))
    assert read(configured(), path) == env_value, var  # the environment over the default
    config_file = tmp_path / "serve.yml"
    config_file.write_text(yaml.safe_dump(nested(path, file_value, context)))
    assert read(configured("--config", str(config_file)), path) == file_value, "the file over the environment"
    if (argv := flag_argv(path, flag_value)) is not None:
        flagged = configured("--config", str(config_file), *argv)
        assert read(flagged, path) == flag_value, "the flag over the file and the environment"


def test_environment_mistakes_are_named_all_at_once(clean_environment, caplog):
    monkeypatch = clean_environment
    monkeypatch.setenv("BASAL_MAX_INFLIGHT", "many")
    monkeypatch.setenv("BASAL_MODELS__0__SCHEDULE", "fifoo")
    monkeypatch.setenv("BASAL_LIMITS", "3")
    with pytest.raises(ConfigError) as e:
        parse_config({})
    message = str(e.value)
    assert message.startswith("the environment: 3 problems:")
    assert "BASAL_MAX_INFLIGHT='many'" in message and "BASAL_MODELS__0__SCHEDULE='fifoo': choose one of" in message
    assert "BASAL_LIMITS__MAX_QUESTIONS" in message  # a section is set key by key
    monkeypatch.delenv("BASAL_MAX_INFLIGHT")
    monkeypatch.delenv("BASAL_MODELS__0__SCHEDULE")
    monkeypatch.delenv("BASAL_LIMITS")
    monkeypatch.setenv("BASAL_MAX_INFLIHGT", "8")  # a typo is a warning with the nearest name, not an error
    assert parse_config({}).max_inflight == 1024
    assert "unknown variable BASAL_MAX_INFLIHGT; did you mean BASAL_MAX_INFLIGHT?" in caplog.text


def test_sections_merge_key_by_key_and_api_keys_from_the_environment_add(clean_environment):
    monkeypatch = clean_environment
    monkeypatch.setenv("BASAL_LIMITS__MAX_ERRORS", "5")
    monkeypatch.setenv("BASAL_API_KEYS", "secret-a,secret-b")
    config = parse_config({"limits": {"max_questions": 7}, "api_keys": ["file-key"]})
    assert (config.limits.max_questions, config.limits.max_errors) == (7, 5)
    assert config.api_keys == ["file-key"]  # the file's list wins whole ...
    assert api_settings(config).api_keys == ("file-key", "secret-a", "secret-b")  # ... and secrets add to it
    assert api_settings(parse_config({})).api_keys == ("secret-a", "secret-b")  # not twice


def test_basal_model_and_basal_config(clean_environment, tmp_path):
    monkeypatch = clean_environment
    monkeypatch.setenv("BASAL_MODEL", "owner/name@v1")
    config = serve_config(build_parser().parse_args(["serve", "--dtype", "bf16"]))
    assert [(m.repo, m.revision, m.dtype) for m in config.models] == [("owner/name", "v1", "bf16")]
    path = tmp_path / "basal.yml"
    path.write_text("max_inflight: 9\nmodels: [{path: demo}]\n")
    monkeypatch.setenv("BASAL_CONFIG", str(path))
    config = serve_config(build_parser().parse_args(["serve"]))
    assert config.max_inflight == 9 and [m.path for m in config.models] == ["demo"]  # the file over BASAL_MODEL
