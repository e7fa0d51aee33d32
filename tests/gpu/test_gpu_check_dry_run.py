"""bench/gpu_check.py --cpu-dry-run: every phase at toy sizes under the Triton interpreter, so GPU minutes are never
spent on a script bug. It runs under image_guard.py (only the imports the GPU machine's image can satisfy); the toy
model must be bitwise eager = graph = bigger bucket = in a batch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "tests" / "gpu" / "image_guard.py"  # imports only what the GPU machine's image has


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (Linux only)")
def test_gpu_check_dry_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself, before importing triton
    done = subprocess.run(
        [sys.executable, str(GUARD), str(ROOT / "bench" / "gpu_check.py"), "--cpu-dry-run", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["phases"]) == {"P0", "P1", "P2", "P3", "P4"}
    assert all(r["bitwise_equal"] for k, r in report["phases"]["P2"].items() if "/" in k)
    toy = report["phases"]["P3"]["toy"]
    assert all(toy["bitwise"].values()) and {"=overlapped", "=interleaved"} <= set(toy["bitwise"])
    assert toy["overlap"]["forwards"] == 2 and toy["overlap"]["speedup"] > 0
    assert "two in flight" in done.stdout  # the table's overlap rows
    p1 = report["phases"]["P1"]
    assert p1["bias"] and all(all(b["invariant"].values()) for b in p1["bias"].values())
    assert p1["swiglu_warps"]["toy"]["same_bits"] and "fused SwiGLU GEMM" in done.stdout
    assert json.loads((tmp_path / "gemm_engines.json").read_text())["shapes"]
