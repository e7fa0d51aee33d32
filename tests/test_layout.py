"""The rules the folders promise, frozen: core imports no backend, api, serve or export; core's folders import in
one order (request -> model -> engine -> packing -> decision, docs/architecture.md); api imports no backend;
backends import no api, serve or Batch API; the Batch API imports nothing of the engine; the GPU path reaches
nothing the GPU machine's image lacks. Each rule is shown failing on a copy of the package with a wrong import
planted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.layout_rules import CORE_ORDER, violations

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_keeps_every_layout_rule():
    assert violations(ROOT) == []


def test_core_folders_form_an_order_without_cycles():
    seen: set[str] = set()
    while len(seen) < len(CORE_ORDER):
        ready = {f for f, deps in CORE_ORDER.items() if f not in seen and deps <= seen}
        assert ready, f"a cycle among {sorted(set(CORE_ORDER) - seen)}"
        seen |= ready


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    shutil.copytree(ROOT / "basal", root / "basal", ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.metal"))
    return root


@pytest.mark.parametrize(
    ("module", "planted", "expected"),
    [
        (
            "basal/core/engine/pipeline.py",
            "from basal.backends.load import load_backend",
            "core imports basal.backends",
        ),
        ("basal/core/request/limits.py", "import basal.api.app", "core imports basal.api.app"),
        ("basal/core/model/prompt.py", "from basal.serve import config", "core imports basal.serve.config"),
        ("basal/core/decision/luce.py", "from basal.export.run import Exporter", "core imports basal.export"),
        (
            "basal/core/request/plan.py",
            "from basal.core.engine.engine import Engine",
            "core/request imports core/engine",
        ),
        ("basal/core/model/tokenizer.py", "from basal.core.request import plan", "core/model imports core/request"),
        (
            "basal/core/packing/tree.py",
            "from basal.core.decision.luce import fit",
            "core/packing imports core/decision",
        ),
        ("basal/core/home.py", "import msgspec", "the GPU path reaches msgspec"),
        (
            "basal/api/routes/health.py",
            "from basal.backends.load import pick_backend",
            "api imports basal.backends.load",
        ),
        ("basal/api/errors.py", "import basal.backends.cuda.backend", "api imports basal.backends.cuda.backend"),
        ("basal/backends/load.py", "from basal.api import errors", "backends imports basal.api.errors"),
        ("basal/backends/cuda/ops.py", "from basal.serve.config import load", "backends imports basal.serve.config"),
        ("basal/backends/mlx/ops.py", "from basal.batch.runner import Decide", "backends imports basal.batch.runner"),
        ("basal/batch/runner.py", "from basal.core.engine.engines import Engines", "batch imports basal.core.engine"),
        ("basal/batch/lines.py", "import basal.core.request.plan", "batch imports basal.core.request.plan"),
        ("basal/batch/store.py", "from basal.backends.load import load_backend", "batch imports basal.backends.load"),
        (
            "basal/core/packing/tile_layout.py",
            "from basal.core.decision import answers",
            "the GPU path reaches msgspec",
        ),
    ],
)
def test_a_planted_wrong_import_is_caught(copy, module, planted, expected):
    path = copy / module
    original = path.read_text()
    try:
        path.write_text(original + f"\n\ndef _planted():\n    {planted}\n")  # even inside a function
        found = violations(copy)
    finally:
        path.write_text(original)
    assert any(expected in v for v in found), found


def test_package_data_globs_follow_the_files_they_ship():
    """The wheel carries the compiled CPU kernels' C source and the Metal kernels only where pyproject's globs
    find them: a moved file with a stale glob builds a wheel without it."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p.relative_to(ROOT).as_posix() for pkg, globs in data.items() for g in globs
               for p in (ROOT / pkg.replace(".", "/")).glob(g)}  # fmt: skip
    assert "basal/backends/cuda/cpu/cpu_kernels.c" in shipped
    assert {
        "basal/backends/mlx/kernels/tree_attention.metal",
        "basal/backends/mlx/kernels/letter_readout.metal",
    } <= shipped
    names = ("index.html", "playground.css", "playground.js", "labelled.html", "labelled.js")
    page = {f"basal/api/static/{name}" for name in names}
    assert page <= shipped and page == {p for p in shipped if p.startswith("basal/api/static/")}
