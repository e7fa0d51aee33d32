"""Every value is checked before anything starts: each key of the schema, walked with NaN, infinities, -1, 0 and a
huge number from the file and from the environment, is either accepted with the meaning it was given (and every
setting the server builds from it builds) or refused with a message naming the key, or the variable. Then the
rules the walk cannot see: ports, HOST:PORT, dates, list indices of the environment, empty API keys, --no-auth,
duplicate YAML keys, the metrics listener on the API's own address, and nothing written before the check."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import msgspec.inspect as mi
import pytest

import basal.serve.server
from basal.api.http.listener import server_config
from basal.cli import main
from basal.core.engine.engine import EngineSettings
from basal.core.engine.gate import Gate
from basal.core.engine.scheduler import Policy
from basal.serve.config import NOT_KEYS, ConfigError, ServeConfig, parse_config, read_config_file
from basal.serve.config_keys import env_name
from basal.serve.server import api_settings, batch_settings, exposure_warnings
from tests.test_config_environment import KEYS, as_env, context_environment, entry_context, nested, read

BAD = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-1": -1, "0": 0, "huge": 1e308, "huge_int": 10**30}


@pytest.fixture
def clean_environment(monkeypatch):
    for var in [v for v in os.environ if v.startswith("BASAL_") and v not in NOT_KEYS]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("BASAL_MODEL", raising=False)
    monkeypatch.delenv("BASAL_CONFIG", raising=False)
    return monkeypatch


def built(config: ServeConfig) -> None:
    """Everything `basal serve` builds from the configuration before it loads a model: none of it may fail."""
    api_settings(config)
    batch_settings(config)
    server_config(None, config.host, config.port, config.limits)  # type: ignore[arg-type]
    Gate(config.long_slice_ms, config.long_share)
    for m in config.models:
        EngineSettings(m.max_batch_tokens, Policy(m.schedule), m.long_tokens, config.limits)


CASES = [(p, name, value) for p, *_ in KEYS for name, value in BAD.items()]


@pytest.mark.parametrize(("path", "name", "value"), CASES, ids=[f"{'.'.join(map(str, p))}={n}" for p, n, _ in CASES])
def test_every_key_with_nan_inf_negative_zero_and_huge(path, name, value, clean_environment):
    key = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")
    for source in ("file", "environment"):
        if source == "file":
            data, var = nested(path, value), None
        else:
            data, var = {}, env_name(path)
            for name, v in context_environment(entry_context(path)).items():
                if name != var:
                    clean_environment.setenv(name, v)
            clean_environment.setenv(var, as_env(value))
        try:
            config = parse_config(data, "serve.yml")
        except ConfigError as e:
            message = str(e)
            assert (var or path[-1]) in message, f"{source}: the refusal names neither key nor variable: {message}"
            assert "Traceback" not in message and len(message) < 600
            continue
        finally:
            if var is not None:
                clean_environment.delenv(var)
        got = read(config, path)
        if isinstance(value, float) and isinstance(got, float):
            assert math.isfinite(got), f"{key}: {source} accepted {name}"
        if got is not None and not isinstance(got, str | list):  # a number or a switch: what was written
            assert got == value or (isinstance(got, bool) and source == "environment"), (key, source, got)
        built(config)


def test_the_walk_covers_numbers_of_every_section():
    numbers = [p for p, f, *_ in KEYS if any(isinstance(t, mi.IntType | mi.FloatType) for t in _members(f.type))]
    assert {p[0] for p in numbers} >= {"limits", "models", "batches", "ray", "max_inflight", "max_body_mb"}


def _members(t: mi.Type) -> list[mi.Type]:
    if isinstance(t, mi.Metadata):
        return _members(t.type)
    return [m for s in t.types for m in _members(s)] if isinstance(t, mi.UnionType) else [t]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"addr": "127.0.0.1:99999"}, "`addr` has port '99999': a port is a whole number from 1 to 65535"),
        ({"addr": "127.0.0.1:0"}, "from 1 to 65535"),
        ({"addr": "localhost"}, "`addr` must be HOST:PORT"),
        ({"addr": 8010}, "`addr` is 8010 (a number): expected text (HOST:PORT); in YAML, put it in quotes"),
        ({"metrics_addr": "127.0.0.1:65536"}, "`metrics_addr` has port '65536'"),
        ({"max_body_mb": 0}, "`max_body_mb` must be at least 0.001, got 0"),
        ({"max_body_mb": -1}, "`max_body_mb` must be at least 0.001"),
        ({"max_body_mb": 1e-9}, "`max_body_mb` must be at least 0.001"),  # 0 bytes: every request 413
        ({"limits": {"max_transit_bytes": 1}}, "`limits.max_transit_bytes` must be at least 65536"),
        ({"max_body_mb": 512}, "`limits.max_transit_bytes` (268435456) is below `max_body_mb` (512 MiB)"),
        (
            {"max_body_mb": 0.5, "limits": {"max_transit_bytes": 1 << 20}},
            "`limits.max_transit_bytes` (1048576) is below what an upload holds while it streams",
        ),
        ({"limits": {"header_timeout_s": 1e-9}}, "`limits.header_timeout_s` must be at least 0.1"),
        ({"limits": {"max_header_bytes": 10}}, "`limits.max_header_bytes` must be at least 1024"),
        ({"max_body_mb": float("inf")}, "`max_body_mb` must be a finite number, got inf"),
        ({"limits": {"header_timeout_s": float("nan")}}, "`limits.header_timeout_s` must be a finite number"),
        ({"limits": {"body_timeout_s": float("nan")}}, "`limits.body_timeout_s` must be a finite number"),
        ({"long_slice_ms": -1}, "`long_slice_ms` must be above 0"),
        ({"shutdown_grace_s": float("inf")}, "`shutdown_grace_s` must be a finite number"),
        ({"limits": {"keep_alive_s": -1}}, "`limits.keep_alive_s` must be above 0"),
        ({"batches": {"max_upload_mb": 1e308}}, "`batches.max_upload_mb` must be at most"),
        ({"batches": {"retention_days": 1e308}}, "`batches.retention_days` must be at most 36500"),
        ({"max_inflight": True}, "`max_inflight` is true (true or false): expected a whole number"),
        ({"limits": 3}, "`limits` is 3 (a number): expected a section of keys"),
        ({"max_inflight": None}, "`max_inflight` is empty (null): expected a whole number"),
        ({"models": ["demo"]}, "`models[0]` is 'demo' (text): expected a section of keys"),
        ({"release_date": "2026-13-01"}, "`release_date` has month 13: a month is 01 to 12"),
        ({"release_date": "2026-02-30"}, "`release_date` is not a day of the calendar: 2026-02 has no day 30"),
        ({"release_date": "soon"}, "`release_date` must be a date written YYYY-MM-DD"),
        ({"release_date": "0000-01-01"}, "`release_date` has year 0000: the calendar starts at 0001"),
        ({"api_keys": "secret"}, "`api_keys` is 'secret' (text): expected a list of text (api key)"),
        ({"api_keys": [""]}, "`api_keys` has item 1 of 1, which is an empty API key"),
        ({"api_keys": ["ok", "  "]}, "`api_keys` has item 2 of 2, which is an empty API key"),
        ({"api_keys": [" key"]}, "starts or ends with white space"),
        ({"cors_origins": ["https://a.example", ""]}, "`cors_origins` has an empty item (2 of 2)"),
        ({"metrics_addr": "127.0.0.1:8000"}, "`metrics_addr` 127.0.0.1:8000 is the API's own `addr`"),
        ({"addr": "0.0.0.0:9000", "metrics_addr": "127.0.0.1:9000"}, "needs a port of its own"),
        ({"addr": "localhost:9000", "metrics_addr": "127.0.0.1:9000"}, "needs a port of its own"),
        ({"no_auth": True, "api_keys": ["k"]}, "`no_auth` (--no-auth) says the server runs without API keys"),
    ],
)
def test_values_are_refused_in_the_users_words(data, words, clean_environment):
    with pytest.raises(ConfigError) as e:
        parse_config(data, "serve.yml")
    assert str(e.value).startswith("serve.yml") and words in str(e.value)


def test_accepted_neighbours_of_the_refused(clean_environment):
    config = parse_config({"addr": "[::1]:65535", "metrics_addr": "127.0.0.1:1", "release_date": "2024-02-29"})
    assert (config.port, config.release_date) == (65535, "2024-02-29")
    assert parse_config({"limits": {"max_prompt_chars": 0}, "shutdown_grace_s": 0, "long_share": 0}).long_share == 0
    assert parse_config({"addr": "127.0.0.1:9000", "metrics_addr": "127.0.0.1:9001"}).metrics_addr


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("BASAL_ADDR", "localhost", "BASAL_ADDR='localhost': must be HOST:PORT"),
        ("BASAL_ADDR", "127.0.0.1:99999", "BASAL_ADDR='127.0.0.1:99999': has port '99999'"),
        ("BASAL_LIMITS__MAX_QUESTIONS", "-3", "BASAL_LIMITS__MAX_QUESTIONS='-3': must be at least 1, got -3"),
        ("BASAL_MAX_INFLIGHT", "0", "BASAL_MAX_INFLIGHT='0': must be at least 1, got 0"),
        ("BASAL_LIMITS__HEADER_TIMEOUT_S", "nan", "BASAL_LIMITS__HEADER_TIMEOUT_S='nan': must be a finite number"),
        ("BASAL_MAX_BODY_MB", "1e999", "BASAL_MAX_BODY_MB='1e999': expected a number (Number out of range)"),
        ("BASAL_MAX_INFLIGHT", "many", "BASAL_MAX_INFLIGHT='many': expected a whole number"),
        ("BASAL_RELEASE_DATE", "2026-13-01", "BASAL_RELEASE_DATE='2026-13-01': has month 13"),
        ("BASAL_MODELS__1000000__PATH", "demo", "BASAL_MODELS__1000000__PATH: the index 1000000 is over 255"),
        ("BASAL_MODELS__²__PATH", "demo", "is a list of sections; name one by its index"),
        ("BASAL_MODELS__1__PATH", "demo", "no variable sets BASAL_MODELS__0__...: entries are numbered from 0"),
        ("BASAL_API_KEYS", "", "BASAL_API_KEYS is set but holds no key (''): give the keys (a,b), or say --no-auth"),
        ("BASAL_API_KEYS", " , ,", "BASAL_API_KEYS=' , ,': has item 1 of 3, which is an empty API key"),
        ("BASAL_API_KEYS", "a,,b", "BASAL_API_KEYS='a,,b': has item 2 of 3, which is an empty API key"),
        ("BASAL_METRICS_ADDR", "127.0.0.1:8000", "(the environment has BASAL_METRICS_ADDR='127.0.0.1:8000')"),
    ],
)
def test_a_bad_variable_is_named_for_range_and_format_errors_too(variable, value, words, clean_environment):
    clean_environment.setenv(variable, value)
    with pytest.raises(ConfigError) as e:
        parse_config({}, "the environment")
    assert words in str(e.value) and "flags" not in str(e.value)


def test_an_empty_key_list_from_the_environment_needs_no_auth(clean_environment):
    clean_environment.setenv("BASAL_API_KEYS", "")
    for data in ({"no_auth": True}, {}):
        if data:
            assert parse_config(data).no_auth is True
        else:
            clean_environment.setenv("BASAL_NO_AUTH", "true")
            assert parse_config(data).no_auth is True and api_settings(parse_config(data)).api_keys == ()
    clean_environment.delenv("BASAL_NO_AUTH")
    assert api_settings(parse_config({"api_keys": ["k"]})).api_keys == ("k",)  # keys from the file: not open
    clean_environment.setenv("BASAL_API_KEYS", "k1, k2")
    with pytest.raises(ConfigError, match=r"`no_auth`.*gives 2"):
        parse_config({"no_auth": True})


def test_no_auth_is_a_flag(clean_environment):
    from basal.cli import build_parser
    from basal.serve.flags import serve_config

    clean_environment.setenv("BASAL_API_KEYS", "")
    assert serve_config(build_parser().parse_args(["serve", "--no-auth"])).no_auth is True
    with pytest.raises(ConfigError, match="BASAL_API_KEYS is set but holds no key"):
        serve_config(build_parser().parse_args(["serve"]))


def test_warnings_for_an_open_server_and_every_origin(clean_environment):
    open_server = parse_config({"addr": "0.0.0.0:8000"})
    warnings = exposure_warnings(open_server, api_settings(open_server))
    assert any("no API key" in w and "0.0.0.0:8000" in w for w in warnings)
    local = parse_config({})
    assert exposure_warnings(local, api_settings(local)) == []
    keyed = parse_config({"addr": "0.0.0.0:8000", "api_keys": ["k"], "cors_origins": ["*"]})
    assert [w for w in exposure_warnings(keyed, api_settings(keyed))] == [
        "cors_origins has '*': any web page a user opens may read this server's answers from their browser; "
        "list the origins that need it instead"
    ]


def test_duplicate_yaml_keys_are_named_with_their_lines(tmp_path):
    path = tmp_path / "serve.yml"
    path.write_text("addr: 127.0.0.1:8000\nmetrics: true\naddr: 0.0.0.0:8000\n")
    with pytest.raises(ConfigError, match=r"serve.yml, line 3: the key `addr` is given twice .*also on line 1"):
        read_config_file(path)
    path.write_text("limits:\n  max_questions: 3\n  max_questions: 4\n")
    with pytest.raises(ConfigError, match=r"line 3: the key `max_questions` is given twice"):
        read_config_file(path)
    path.write_text("base: &b {max_questions: 3}\nlimits:\n  <<: *b\n  max_questions: 4\n")  # a merge may be overridden
    assert read_config_file(path)["limits"] == {"max_questions": 4}


def test_dates_in_yaml_stay_text_and_are_checked_in_words(tmp_path):
    path = tmp_path / "serve.yml"
    path.write_text("release_date: 2026-13-01\n")
    with pytest.raises(ConfigError, match="`release_date` has month 13: a month is 01 to 12"):
        parse_config(read_config_file(path), str(path))


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--max-body-mb", "inf"], {}, "max_body_mb"),
        (["--max-body-mb", "1e308"], {}, "max_body_mb"),
        (["--addr", "127.0.0.1:99999"], {}, "addr"),
        (["--header-timeout-s", "nan"], {}, "header_timeout_s"),
        ([], {"BASAL_BATCHES__RETENTION_DAYS": "inf"}, "BASAL_BATCHES__RETENTION_DAYS"),
        (["--metrics-addr", "127.0.0.1:8000"], {}, "metrics_addr"),
        ([], {"BASAL_API_KEYS": ""}, "BASAL_API_KEYS"),
    ],
)
def test_nothing_is_written_or_loaded_before_the_configuration_is_good(
    argv, env, named, tmp_path, capsys, clean_environment
):
    home = tmp_path / "home"
    clean_environment.setenv("BASAL_HOME", str(home))
    for k, v in env.items():
        clean_environment.setenv(k, v)
    clean_environment.setattr(basal.serve.server, "pending_engines", lambda *a, **k: pytest.fail("loading began"))
    clean_environment.setattr(basal.serve.server, "load_models", lambda *a, **k: pytest.fail("a model loaded"))
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not home.exists() or not any(home.rglob("*")), sorted(Path(home).rglob("*"))


def test_the_log_warns_when_a_server_starts_open(caplog, monkeypatch, clean_environment):
    from basal.api.http.listener import DrainingServer
    from basal.core.engine.engines import Engines
    from basal.core.engine.metrics import Metrics

    monkeypatch.setattr(DrainingServer, "run", lambda self: None)
    caplog.set_level(logging.WARNING, logger="basal")
    basal.serve.server.listen(Engines({}, "none", Metrics(8), 8), parse_config({"addr": "0.0.0.0:8123"}))
    assert "no API key: anyone who reaches 0.0.0.0:8123 can use this server" in caplog.text
