"""Shared fixtures: golden data copied into tests/data, and one synthetic demo model per session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from basal.core.model_dir import ModelDir
from basal.core.synth import synth_model

# the GEMM chunk probe keeps no disk cache in tests (each session probes the demo shapes once, in well under a second)
os.environ.setdefault("BASAL_GEMM_CACHE", "off")

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden"


def golden_records(name: str) -> list[dict]:
    return [json.loads(line) for line in (GOLDEN / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    return synth_model(tmp_path_factory.mktemp("models") / "demo", "demo", seed=0)


@pytest.fixture(scope="session")
def demo_model(demo_dir) -> ModelDir:
    return ModelDir.load(demo_dir)
