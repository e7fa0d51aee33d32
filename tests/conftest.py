"""Shared fixtures: golden data copied into tests/data, and one synthetic demo model per session."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model

# the GEMM chunk probe keeps no disk cache in tests (each session probes the demo shapes once, in well under a second)
os.environ.setdefault("BASAL_GEMM_CACHE", "off")

DATA = Path(__file__).parent / "data"
pytest_plugins = ("tests.postgres",)  # `postgres` (a real server of the session's own) and `database` fixtures


def pytest_collection_finish(session) -> None:
    """Start the background commands of the collected tests that will run (tests/background.py)."""
    from tests import background

    if session.config.option.collectonly:
        return
    commands = [
        marker.args[0]
        for item in session.items
        if not any(skip.args and skip.args[0] is True for skip in item.iter_markers("skipif"))
        for marker in item.iter_markers("background")
    ]
    background.start(list(dict.fromkeys(commands)))


def pytest_sessionfinish(session) -> None:
    from tests import background

    background.stop()


GOLDEN = DATA / "golden"


def golden_records(name: str) -> list[dict]:
    return [json.loads(line) for line in (GOLDEN / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The built-in demo model, as `make serve` serves it (with a seeded evidence head)."""
    return synth_model(tmp_path_factory.mktemp("models") / "demo", "demo", seed=0, evidence_head=True)


@pytest.fixture(scope="session")
def demo_model(demo_dir) -> ModelDir:
    return ModelDir.load(demo_dir)


@pytest.fixture(scope="session")
def headless_model(demo_dir, tmp_path_factory) -> ModelDir:
    """The demo model without its evidence head (evidence is refused)."""
    path = tmp_path_factory.mktemp("models") / "headless"
    shutil.copytree(demo_dir, path, ignore=shutil.ignore_patterns("evidence_head.pt"))
    return ModelDir.load(path)


@pytest.fixture(scope="session")
def biased_model(tmp_path_factory) -> ModelDir:
    """The demo shapes in the basal-1.0 layout: attention and MLP biases in every layer."""
    return ModelDir.load(synth_model(tmp_path_factory.mktemp("models") / "biased", "demo", seed=3, bias=True))
