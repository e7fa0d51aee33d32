"""Runs the Triton kernel tests in `interpreter/` in a process of their own, with TRITON_INTERPRET=1 set before
triton is imported and the order-fixed dot installed (docs/gpu-path.md §8.1 a)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_interpreter_tests(marker: str, timeout: int) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            str(ROOT / "tests/gpu/interpreter"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]


NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (Linux)")


@NEEDS_TRITON
def test_kernels_under_the_triton_interpreter():
    _run_interpreter_tests("not slow", 900)


@NEEDS_TRITON
@pytest.mark.slow
def test_gpu_model_end_to_end_under_the_triton_interpreter():
    _run_interpreter_tests("slow", 3600)
