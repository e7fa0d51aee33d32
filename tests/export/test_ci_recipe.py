"""The CI recipe in examples/ci: the workflow is valid YAML that runs the shell recipe, and the recipe runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from basal.backends.load import load_backend_class

CI = Path(__file__).parents[2] / "examples" / "ci"
SCRIPT = CI / "determinism.sh"


def test_workflow_has_an_export_matrix_and_a_compare_job():
    flow = yaml.safe_load((CI / "github-actions-determinism.yml").read_text())
    matrix = flow["jobs"]["export"]["strategy"]["matrix"]["include"]
    assert {(m["backend"], m["dtype"]) for m in matrix} >= {("torch", "f32"), ("mlx", "f16"), ("mlx", "bf16")}
    steps = " ".join(str(s.get("run", "")) for s in flow["jobs"]["export"]["steps"])
    assert "examples/ci/determinism.sh export" in steps
    assert flow["jobs"]["compare"]["needs"] == "export"
    assert any("compare-all" in str(s.get("run", "")) for s in flow["jobs"]["compare"]["steps"])
    assert (CI / "requests.jsonl").is_file() and os.access(SCRIPT, os.X_OK)


def test_script_without_a_command_prints_its_usage():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "compare-all OUT_DIR" in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(load_backend_class("mlx") is None, reason="MLX is not installed")
def test_recipe_exports_and_compares(demo_dir, tmp_path):
    env = {
        **os.environ,
        "BASAL": f"{sys.executable} -m basal",
        "PYTHONPATH": str(CI.parents[1]),
    }
    out = tmp_path / "exports"
    for backend in ("torch", "mlx"):
        subprocess.run(
            ["bash", str(SCRIPT), "export", str(demo_dir), str(CI / "requests.jsonl"), backend, "f32", str(out), "ci"],
            check=True,
            env=env,
            capture_output=True,
        )
    done = subprocess.run(["bash", str(SCRIPT), "compare-all", str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== ci-mlx-f32 vs ci-torch-f32" in done.stdout and "PASS" in done.stdout
