"""Runs the Triton kernel tests in `interpreter/` in a process of their own, with TRITON_INTERPRET=1 set before
triton is imported and the order-fixed dot installed (docs/gpu-path.md §8.1 a). The process starts in the
background when collection finishes (tests/background.py) and runs beside the rest of the suite."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests import background

ROOT = Path(__file__).resolve().parents[2]


def _interpreter_tests(marker: str, timeout: int) -> background.Command:
    pythonpath = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    argv = (
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        marker,
        str(ROOT / "tests/gpu/interpreter"),
    )
    return background.Command(
        argv, background.environment(TRITON_INTERPRET="1", PYTHONPATH=pythonpath), str(ROOT), timeout
    )


def kernels() -> background.Command:
    return _interpreter_tests("not slow", 900)


def end_to_end() -> background.Command:
    return _interpreter_tests("slow", 3600)


def _check(done) -> None:
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]


NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (Linux)")


@NEEDS_TRITON
@pytest.mark.background.with_args(kernels)
def test_kernels_under_the_triton_interpreter():
    _check(background.result(kernels))


@NEEDS_TRITON
@pytest.mark.slow
@pytest.mark.background.with_args(end_to_end)
def test_gpu_model_end_to_end_under_the_triton_interpreter():
    _check(background.result(end_to_end))
