"""A Mac's default install has MLX and no torch: choosing the backend, serving and `basal doctor` must not import it.

Each check runs in a fresh interpreter with an import hook that refuses torch (this process has torch loaded), on a
platform made to read as Apple Silicon; MLX runs on the CPU here (mlx[cpu])."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

ROOT = Path(__file__).resolve().parents[2]
HIDE_TORCH = """
import importlib.abc, platform, sys

class RefuseTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, RefuseTorch())
platform.system, platform.machine = (lambda: "Darwin"), (lambda: "arm64")
"""


def run_without_torch(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", HIDE_TORCH + code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_auto_picks_mlx_and_serves_a_decision_without_torch():
    out = run_without_torch(
        """
from basal.backends.load import load_backend, pick_backend
from basal.core.engine.pipeline import Pipeline
from basal.core.request.model_names import model_resolver
from basal.core.model.synth import demo_model
from basal.core.request.dialects import parse_systemone

assert pick_backend("auto") == "mlx"
model = demo_model()
backend = load_backend(model, "auto")
body = {"model": model.name, "state": "late parcel", "questions": {"q": {"type": "noul", "instructions": "?"}}}
answer = Pipeline(model, backend).decide(parse_systemone(body, model_resolver([model.name], model.name)))
print(backend.name, type(answer).__name__, "torch" in sys.modules)
"""
    )
    assert out.split() == ["mlx", "SystemOneResponse", "False"]


def test_doctor_lists_mlx_and_says_torch_is_missing():
    out = run_without_torch(
        """
from basal.doctor import report
print(report(None, run_checks=False))
print("torch imported:", "torch" in sys.modules)
"""
    )
    assert "  mlx    cpu" in out and "  torch  cpu" not in out
    assert "CUDA: torch is not installed" in out and "torch imported: False" in out
