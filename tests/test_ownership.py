"""The `basal` command refuses to run where another project's distribution wrote into the `basal` package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import basal
from basal import ownership

ROOT = Path(__file__).resolve().parents[1]


def plant(site: Path, name: str, files: list[str]) -> None:
    """A minimal installed distribution `name` in `site` whose RECORD lists `files`."""
    info = site / f"{name.replace('-', '_')}-3.0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 3.0.3\nSummary: upstream server\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/METADATA"]))


def test_this_environment_has_no_conflict():
    assert basal.__distribution__ == ownership.DISTRIBUTION
    assert ownership.conflict() is None


def test_a_foreign_distribution_in_the_basal_package_is_named(tmp_path, monkeypatch):
    plant(tmp_path, "basal-engine", ["basal/__init__.py", "basal/server.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    problem = ownership.conflict()
    assert problem and "basal-engine 3.0.3 (upstream server)" in problem
    assert "virtual environment of its own" in problem and "pip uninstall basal-engine" in problem


def test_a_former_editable_install_of_ours_is_no_conflict(tmp_path, monkeypatch):
    plant(tmp_path, "basal-engine", ["__editable___basal_engine_0_1_0_finder.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ownership.conflict() is None


def test_a_replaced_init_is_named(monkeypatch):
    monkeypatch.delattr(basal, "__distribution__")
    problem = ownership.conflict()
    assert problem and "is not basal-bitwise's" in problem


@pytest.mark.parametrize("planted", [False, True])
def test_the_command_stops_before_anything_else(tmp_path, planted):
    if planted:
        plant(tmp_path, "basal-engine", ["basal/__init__.py"])
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-m", "basal", "compare", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    if planted:
        assert run.returncode == 2 and "basal-engine 3.0.3" in run.stderr, run.stderr
    else:
        assert run.returncode == 0, run.stderr
