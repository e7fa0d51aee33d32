"""The `ray:` configuration section, and that plain `basal serve` never imports Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from basal.serve.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_configs_parse():
    config = load_config(ROOT / "examples" / "ray" / "basal.yml")
    assert config.ray.address == "auto" and config.ray.num_gpus == 1 and config.ray.autoscaling.max_replicas == 4


def test_ray_keys_are_checked():
    assert parse_config({"ray": {}}).ray.replicas == 2
    with pytest.raises(ConfigError, match=r"unknown key `ray\.replica`; did you mean `replicas`"):
        parse_config({"ray": {"replica": 3}})
    with pytest.raises(ConfigError, match="min_replicas <= max_replicas"):
        parse_config({"ray": {"autoscaling": {"min_replicas": 5, "max_replicas": 2}}})
    with pytest.raises(ConfigError, match="router"):
        parse_config({"ray": {"router": "random"}})


def test_plain_serving_never_imports_ray():
    code = "import sys, basal.cli, basal.serve.server, basal.api.app; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
