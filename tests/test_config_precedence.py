"""`basal serve` settings: flags > configuration file > environment > defaults; every mistake reported at once."""

from __future__ import annotations

import pytest

import basal.serve.server
from basal.cli import main
from basal.serve.config import ConfigError, parse_config


@pytest.fixture
def served(monkeypatch):
    """The ServeConfig `basal serve ARGS` would serve, without loading anything."""
    seen = []
    monkeypatch.setattr(basal.serve.server, "serve", seen.append)
    monkeypatch.delenv("BASAL_ADDR", raising=False)

    def run(*args: str):
        assert main(["serve", *args]) == 0
        return seen.pop()

    return run


def test_flag_beats_file_beats_environment_beats_default(served, tmp_path, monkeypatch):
    path = tmp_path / "serve.yml"
    path.write_text("addr: 127.0.0.1:9001\n")
    assert served().addr == "127.0.0.1:8000"
    monkeypatch.setenv("BASAL_ADDR", "127.0.0.1:9002")
    assert served().addr == "127.0.0.1:9002"  # environment over the default
    assert served("--config", str(path)).addr == "127.0.0.1:9001"  # the file over the environment
    assert served("--config", str(path), "--addr", "127.0.0.1:9003").addr == "127.0.0.1:9003"  # the flag over all
    assert served("--addr", "127.0.0.1:8000").addr == "127.0.0.1:8000"  # a flag given at its default still wins


def test_flags_laid_over_a_file_key_by_key(served, tmp_path):
    path = tmp_path / "serve.yml"
    path.write_text(
        "metrics: true\napi_keys: [file-key]\nlimits: {max_questions: 10, max_errors: 5}\n"
        "models:\n  - {path: /m/a, dtype: f16, schedule: fifo}\n  - {path: /m/b}\n"
    )
    config = served("--config", str(path))
    assert config.metrics and config.api_keys == ["file-key"] and config.models[0].schedule == "fifo"
    config = served("--config", str(path), "--no-metrics", "--dtype", "bf16", "--max-questions", "7", "--api-key", "k")
    assert not config.metrics and config.api_keys == ["k"]
    assert [m.dtype for m in config.models] == ["bf16", "bf16"]  # a model flag applies to every model
    assert config.models[0].schedule == "fifo"  # keys no flag names stay the file's
    assert (config.limits.max_questions, config.limits.max_errors) == (7, 5)
    config = served("--config", str(path), "--model", "/m/c")
    assert [m.path for m in config.models] == ["/m/c"]  # --model replaces the file's models


def test_model_flags_reach_the_demo_model(served):
    config = served("--dtype", "bf16", "--long-tokens", "0")
    assert [(m.path, m.dtype, m.long_tokens) for m in config.models] == [("demo", "bf16", 0)]
    assert served().models == []  # nothing given: the built-in demo with its defaults


def test_a_flag_error_names_the_file_and_the_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(basal.serve.server, "serve", lambda config: pytest.fail("served a bad configuration"))
    path = tmp_path / "serve.yml"
    path.write_text("metrics: true\n")
    assert main(["serve", "--config", str(path), "--addr", "8000"]) == 2
    err = capsys.readouterr().err
    assert "serve.yml with the flags given" in err and "HOST:PORT" in err and "Traceback" not in err


def test_every_unknown_key_and_enum_value_at_once_with_did_you_mean(tmp_path, capsys):
    bad = {
        "metric": True,
        "limits": {"max_question": 3},
        "models": [{"path": "/m", "dtyp": "f16", "backend": "tourch"}, {"path": "/n", "dtype": "fp16"}],
        "ray": {"router": "random"},
    }
    with pytest.raises(ConfigError) as e:
        parse_config(bad, "serve.yml")
    message = str(e.value)
    assert message.startswith("serve.yml: 6 problems:")
    for expected in (
        "unknown key `metric`; did you mean `metrics`",
        "unknown key `limits.max_question`; did you mean `max_questions`",
        "unknown key `models[0].dtyp`; did you mean `dtype`?",
        "`models[0].backend` is 'tourch': choose one of auto, mlx, torch; did you mean 'torch'?",
        "`models[1].dtype` is 'fp16': choose one of bf16, f16, f32; did you mean 'f16'?",
        "`ray.router` is 'random': choose one of affinity, power_of_two",
    ):
        assert expected in message
    with pytest.raises(ConfigError, match=r"unknown key `zzz`; valid here: models, addr"):
        parse_config({"zzz": 1})  # nothing near: the valid keys instead


def test_names_must_be_unique(demo_dir):
    with pytest.raises(ConfigError, match=r"`models\[0\]` and `models\[1\]` would both be served as name 'a'"):
        parse_config({"models": [{"path": "demo", "name": "a"}, {"path": str(demo_dir), "name": "a"}]})
    with pytest.raises(ConfigError, match="give one of them a different `name:`"):
        parse_config({"models": [{"path": str(demo_dir)}, {"path": str(demo_dir), "dtype": "bf16"}]})
    with pytest.raises(ConfigError, match="`name` must not be empty"):
        parse_config({"models": [{"path": "demo", "name": " "}]})


def test_colliding_directory_names_are_refused_before_any_weights_load(demo_dir, monkeypatch):
    monkeypatch.setattr(basal.serve.server, "load_backend", lambda *a: pytest.fail("weights loaded before the check"))
    config = parse_config({"models": [{"path": "demo"}, {"path": str(demo_dir)}]})  # both basal-synthetic-demo
    with pytest.raises(ConfigError, match=r"both named 'basal-synthetic-demo'.*add `name: basal-synthetic-demo-2`"):
        basal.serve.server.build_engines(config)


def test_unquoted_release_date_in_yaml_is_read_as_text(tmp_path):
    from basal.serve.config import load_config

    path = tmp_path / "serve.yml"
    path.write_text("release_date: 2026-11-30\n")
    assert load_config(path).release_date == "2026-11-30"
