"""`basal serve` wiring: configuration files, several models in one process, the demo default."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from basal.serve.config import ConfigError, load_config, parse_config
from basal.serve.server import api_settings, build_engines
from tests.servers import live_server


def test_config_file_and_unknown_keys(tmp_path):
    path = tmp_path / "serve.yml"
    path.write_text(
        "addr: 127.0.0.1:9000\nmetrics: true\nmodels:\n  - path: /m\n    schedule: fifo\n    long_tokens: 0\n"
    )
    config = load_config(path)
    assert (config.port, config.metrics, config.models[0].schedule, config.models[0].long_tokens) == (
        9000,
        True,
        "fifo",
        0,
    )
    path.write_text("models:\n  - path: /m\n    max_batch_token: 10\n")
    with pytest.raises(ConfigError, match="max_batch_token"):
        load_config(path)
    with pytest.raises(ConfigError, match="gemm_table"):
        parse_config({"models": [{"path": "/m", "gemm_table": "tables/x.json"}]})
    with pytest.raises(ConfigError, match="exactly one"):
        parse_config({"models": [{"path": "/m", "repo": "Remek/basal-1.5-mini"}]})


def test_two_models_in_one_process_share_one_gate(demo_dir, tmp_path, monkeypatch):
    second = tmp_path / "second"
    shutil.copytree(demo_dir, second)
    meta = json.loads((second / "basal.json").read_text())
    (second / "basal.json").write_text(json.dumps({**meta, "name": "second-demo"}))
    config = parse_config(
        {
            "models": [{"path": str(demo_dir)}, {"path": str(second), "long_tokens": 0}],
            "default_model": "second-demo",
            "api_keys": ["k"],
        }
    )
    monkeypatch.setenv("BASAL_API_KEYS", "k2, k3")
    engines = build_engines(config)
    first, other = engines.engines.values()
    assert first.gate is other.gate and other.long is None and first.long is not None
    settings = api_settings(config)
    assert settings.api_keys == ("k", "k2", "k3")
    body = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    with live_server(engines, settings) as url:
        auth = {"authorization": "Bearer k3"}
        models = httpx.get(f"{url}/v1/models", headers=auth).json()["models"]
        assert [m["name"] for m in models] == ["basal-synthetic-demo", "second-demo"]
        assert httpx.post(f"{url}/v1/basal", json=body, headers=auth).json()["model"] == "second-demo"
        r = httpx.post(f"{url}/v1/systemone", json={**body, "model": "basal-synthetic-demo"}, headers=auth)
        assert r.json()["model"] == "basal-synthetic-demo"
        assert (
            httpx.post(f"{url}/v1/systemone", json={**body, "model": "jev-latest"}, headers=auth).json()["model"]
            == "second-demo"
        )


def test_the_demo_model_is_served_when_no_model_is_given(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("BASAL_HOME", str(tmp_path))
    engines = build_engines(parse_config({}))
    assert list(engines.engines) == ["basal-synthetic-demo"]
    assert "carry no meaning" in caplog.text


def test_limits_in_yaml_and_flags(tmp_path):
    path = tmp_path / "serve.yml"
    path.write_text("limits:\n  max_questions: 10\n  header_timeout_s: 2.5\ncors_origins: [https://app.example]\n")
    config = load_config(path)
    assert (config.limits.max_questions, config.limits.header_timeout_s) == (10, 2.5)
    assert config.limits.max_request_tokens == 262_144 and config.cors_origins == ["https://app.example"]
    settings = api_settings(config)
    assert settings.limits.max_questions == 10 and settings.cors_origins == ("https://app.example",)
    with pytest.raises(ConfigError, match="max_question"):
        parse_config({"limits": {"max_question": 10}})
    with pytest.raises(ConfigError, match=r"`limits\.max_errors` must be at least 1, got 0"):
        parse_config({"limits": {"max_errors": 0}})


def test_limit_flags_reach_the_config(monkeypatch):
    import basal.serve.server
    from basal.cli import main

    seen = []
    monkeypatch.setattr(basal.serve.server, "serve", seen.append)
    main(["serve", "--max-questions", "7", "--body-timeout-s", "1.5", "--cors-origin", "https://a.example"])
    assert (seen[0].limits.max_questions, seen[0].limits.body_timeout_s) == (7, 1.5)
    assert seen[0].cors_origins == ["https://a.example"]


def test_the_long_lane_floor_in_yaml_and_flags(demo_dir, monkeypatch):
    import basal.serve.server
    from basal.cli import main

    config = parse_config({"models": [{"path": str(demo_dir)}], "long_share": 0.4})
    assert build_engines(config).engines["basal-synthetic-demo"].gate.long_share == 0.4
    assert parse_config({}).long_share == 0.25
    with pytest.raises(ConfigError, match="long_share"):
        parse_config({"long_share": 1.0})
    seen = []
    monkeypatch.setattr(basal.serve.server, "serve", seen.append)
    main(["serve", "--long-share", "0"])
    assert seen[0].long_share == 0.0
