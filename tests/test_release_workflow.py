"""The Actions workflows: zizmor finds nothing in them, and finds a planted fault; the release's version check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import basal

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
LINTED = [WORKFLOW, ROOT / "examples" / "ci" / "github-actions-determinism.yml"]


def zizmor() -> str:
    """The zizmor binary of this venv (the dev extra ships it), else PATH's."""
    found = (
        os.environ.get("ZIZMOR")
        or shutil.which("zizmor", path=str(Path(sys.executable).parent))
        or shutil.which("zizmor")
    )
    if not found:
        pytest.fail("zizmor is missing: it comes with the dev extra (make venv), or set ZIZMOR=/path/to/zizmor")
    return found


def lint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [zizmor(), "--offline", "--no-progress", "--format", "plain", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def steps(job: str) -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]


@pytest.mark.parametrize("path", LINTED, ids=lambda p: p.name)
def test_zizmor_finds_nothing(path):
    run = lint(path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_zizmor_finds_a_planted_fault(tmp_path):
    """Negative control: a tag-named action and an expression spliced into a shell script."""
    text = WORKFLOW.read_text()
    planted = text.replace(
        "run: |\n          version=",
        'run: |\n          echo "${{ github.event.head_commit.message }}"\n          version=',
    ).replace("actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", "actions/checkout@v4")
    assert planted.count("head_commit") == 1 and "checkout@v4" in planted
    bad = tmp_path / ".github" / "workflows" / "release.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(planted)
    run = lint(bad)
    assert run.returncode != 0
    assert "template-injection" in run.stdout and "unpinned-uses" in run.stdout, run.stdout


def version_check() -> str:
    (step,) = [s for s in steps("dist") if s.get("name", "").startswith("the tag is")]
    return step["run"]


@pytest.mark.parametrize("tag", [f"v{basal.__version__}", "v9.9.9", basal.__version__, f"v{basal.__version__}.1"])
def test_the_tag_must_be_v_and_the_version(tag):
    run = subprocess.run(
        ["bash", "-e", "-c", version_check()], cwd=ROOT, env={**os.environ, "TAG": tag}, capture_output=True, text=True
    )
    if tag == f"v{basal.__version__}":
        assert run.returncode == 0, run.stdout + run.stderr
    else:
        assert run.returncode == 1 and f"is not v{basal.__version__}" in run.stdout


def test_publishing_is_trusted_and_last():
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    pypi = jobs["pypi"]
    assert pypi["permissions"] == {"id-token": "write"} and pypi["environment"]["name"] == "pypi"
    assert set(pypi["needs"]) == {"dist", "images"}
    publish = pypi["steps"][-1]
    assert publish["uses"].startswith("pypa/gh-action-pypi-publish@") and "with" not in publish  # no token
    built = " ".join(s.get("run", "") for s in steps("dist"))
    assert "python -m build" in built and "twine check" in built
    assert jobs["images"]["strategy"]["matrix"]["target"] == ["cpu", "cuda"]
