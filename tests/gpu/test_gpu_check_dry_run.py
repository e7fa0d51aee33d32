"""bench/checks/gpu_check.py --cpu-dry-run: every phase at toy sizes under the Triton interpreter, so GPU minutes are
never
spent on a script bug. It runs under image_guard.py (only the imports the GPU machine's image can satisfy); the toy
model must be bitwise eager = graph = bigger bucket = in a batch, a checkpoint on disk must load and agree with the
CPU, and `basal serve` must answer over HTTP. The script starts in the background when collection finishes
(tests/background.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import background

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "tests" / "gpu" / "image_guard.py"  # imports only what the GPU machine's image has


def dry_run() -> background.Command:
    out = tempfile.mkdtemp(prefix="gpu_check_dry_run.")
    argv = (sys.executable, str(GUARD), str(ROOT / "bench" / "checks" / "gpu_check.py"), "--cpu-dry-run", "--out", out)
    # the script sets TRITON_INTERPRET itself, before importing triton
    return background.Command(argv, background.environment(PYTHONPATH=str(ROOT), TRITON_INTERPRET=None), str(ROOT), 900)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (Linux only)")
@pytest.mark.background.with_args(dry_run)
def test_gpu_check_dry_run():
    done = background.result(dry_run)
    out = Path(done.args[-1])
    try:
        _check(done, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _check(done, tmp_path: Path) -> None:
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["phases"]) == {"P0", "P1", "P2", "P3", "P4"} and "interrupted" not in report
    assert not any("partial" in r for r in report["phases"].values())  # every phase's final result
    assert all(r["bitwise_equal"] for k, r in report["phases"]["P2"].items() if "/" in k)
    toy = report["phases"]["P3"]["toy"]
    assert all(toy["bitwise"].values()) and {"=overlapped", "=interleaved", "=state_cache_hits"} <= set(toy["bitwise"])
    assert toy["overlap"]["forwards"] == 2 and toy["overlap"]["speedup"] > 0
    assert "two in flight" in done.stdout  # the table's overlap rows
    checkpoint = report["phases"]["P3"]["checkpoint basal-1.0"]  # basal serve's path: a model directory on disk
    assert all(checkpoint["checks"].values()) and len(checkpoint["checks"]) == 6, checkpoint
    assert "serve path, checkpoint on disk" in done.stdout
    serve = report["phases"]["P3"]["serve"]  # basal serve itself, over HTTP, in a child process (CPU here)
    assert all(serve["checks"].values()) and serve["compute"]["device"] == "cpu", serve
    assert {"same_answers_under_load", "graceful_shutdown"} <= set(serve["checks"])
    assert "basal serve over HTTP (torch cpu" in done.stdout
    p1 = report["phases"]["P1"]
    assert p1["bias"] and all(all(b["invariant"].values()) for b in p1["bias"].values())
    assert "error" not in p1["lt_library_defaults"] and "library's defaults" in done.stdout  # the child ran
    assert p1["swiglu_warps"]["toy"]["same_bits"] and "fused SwiGLU GEMM" in done.stdout
    assert json.loads((tmp_path / "gemm_table.json").read_text())["shapes"]
    assert all(p1["tri_configs_equal"].values()) and len(p1["tri_configs"]) == 2, p1["tri_configs"]
    assert all("gemm" in g for g in p1["shapes"].values())  # every toy shape probed, none failed or skipped
