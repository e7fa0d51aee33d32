"""bench/checks/serve_check.py, `basal serve` checked over HTTP (gpu_check's P3 on the GPU machine): it runs here
against a
real server on the CPU, and its failure paths say what happened."""

from __future__ import annotations

import math

from bench.checks import serve_check


def test_a_real_server_on_the_cpu_passes_every_check():
    result = serve_check.serve_checks("cpu", demo=True)
    assert all(result["checks"].values()) and len(result["checks"]) == 8, result["checks"]
    assert "cpu_path" in result["checks"]
    assert result["compute"]["device"] == "cpu" and result["under_load"]["requests"] == serve_check.SERVE_LOAD
    assert result["http_single_ms_median"] > 0 and "Application shutdown complete" in result["log_tail"]


def test_serve_is_skipped_with_what_to_do_where_its_packages_are_missing(monkeypatch):
    monkeypatch.setattr(serve_check, "SERVE_PACKAGES", ("litestar", "no_such_package_here"))
    skipped = serve_check.serve_checks("cpu", demo=True)
    assert "no_such_package_here" in skipped["skipped"] and "make gpu-wheels" in skipped["skipped"]


def test_a_server_that_cannot_start_is_an_error_with_its_log(monkeypatch, tmp_path):
    """A real `basal serve` child that exits at once (no such model)."""
    import basal.core.model.synth

    monkeypatch.setattr(basal.core.model.synth, "synth_model", lambda out, *a, **k: tmp_path / "no-such-model")
    failed = serve_check.serve_checks("cpu", demo=True, deadline=math.inf)
    assert failed["error"].startswith("basal serve exited with") and "no-such-model" in failed["log"]


def test_each_expected_path_is_judged_from_what_v1_models_reports():
    torch_cpu = {"backend": "torch", "device": "cpu", "dtype": "f32"}
    gpu = {"backend": "torch", "device": "cuda:0", "dtype": "f16", "path": "gpu (Triton kernels, probed GEMMs)"}
    portable_cuda = {"backend": "torch", "device": "cuda:0", "dtype": "f16"}  # CUDA without Triton
    metal = {"backend": "mlx", "device": "metal", "dtype": "f16"}
    judge = serve_check.PATHS
    assert judge["cuda"](gpu) and not judge["cuda"](portable_cuda) and not judge["cuda"](torch_cpu)
    assert judge["metal"](metal) and not judge["metal"](torch_cpu)
    assert judge["cpu"](torch_cpu) and not judge["cpu"](metal)
