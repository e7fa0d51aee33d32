"""bench/checks/gpu_check.py's bookkeeping, without running a model: a GPU window is short, so a failing or slow model
size
must not cost the others their results, and the table must say what happened to each."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.checks import gpu_check

CPU = torch.device("cpu")
GOOD = {
    "bitwise": {"eager=graph": True},
    "single_ms_median": 2.0,
    "single_ms_p90": 2.5,
    "throughput": {"2048": {"decisions_per_s": 900.0}, "4096": {"decisions_per_s": 1500.0}},
    "overlap": {"forwards": 8, "sequential_ms": 2.5, "overlapped_ms": 2.0, "speedup": 1.25},
}


CHECKPOINT = {
    "checks": {"auto_picks_gpu_path": True, "alone=in_batch": True},
    "backend": "GpuBackend",
    "load_s": 1.5,
    "warm_up_graphs": 37,
    "warm_up_s": 2.25,
    "max_rel_error_vs_cpu_f32": 1e-3,
}


@pytest.fixture
def report(tmp_path):
    return gpu_check.Report(tmp_path / "gpu_check.json", {"dry_run": False})


SERVE = {
    "checks": {"cuda_path": True, "systemone_200": True},
    "compute": {"backend": "torch", "device": "cuda:0", "dtype": "f16", "path": "gpu (Triton kernels)"},
    "ready_s": 12.5,
    "http_single_ms_median": 3.25,
    "http_single_ms_p90": 4.5,
    "compute_ms_median": 1.75,
    "under_load": {"requests": 16, "largest_batch": 9},
}


@pytest.fixture(autouse=True)
def no_checkpoint_on_disk(monkeypatch):
    """phase_model's checkpoint and serve checks write and load a real model: these tests stand in for them."""
    monkeypatch.setattr(gpu_check, "checkpoint_checks", lambda device, dry, bias: dict(CHECKPOINT))
    monkeypatch.setattr(gpu_check, "serve_checks", lambda cuda, demo, deadline: dict(SERVE))


def test_a_failing_size_is_recorded_and_the_next_size_still_runs(report, monkeypatch):
    def checks(size, device, dry):
        if size == "mini":
            raise RuntimeError("capture failed")
        return dict(GOOD)

    monkeypatch.setattr(gpu_check, "model_checks", checks)
    res = gpu_check.phase_model(CPU, False, ["mini", "4.5B"], report, math.inf)
    assert res["mini"]["error"] == "RuntimeError: capture failed"
    assert "Traceback" in res["mini"]["traceback"]
    assert res["4.5B"]["bitwise"] == {"eager=graph": True}
    assert list(res) == ["checkpoint basal-1.5", "mini", "4.5B", "serve", "checkpoint basal-1.0"]  # by priority
    on_disk = json.loads(report.path.read_text())["phases"]["P3"]  # written after every size
    assert on_disk["partial"] and set(on_disk) >= {"mini", "4.5B"}


def test_a_failing_checkpoint_is_recorded_the_other_runs_and_the_verdict_fails(report, monkeypatch):
    def checkpoint(device, dry, bias):
        if bias:
            raise OSError("no space left on device")
        return {**CHECKPOINT, "checks": {"auto_picks_gpu_path": False, "alone=in_batch": True}}

    monkeypatch.setattr(gpu_check, "model_checks", lambda size, device, dry: dict(GOOD))
    monkeypatch.setattr(gpu_check, "checkpoint_checks", checkpoint)
    res = gpu_check.phase_model(CPU, False, ["mini"], report, math.inf)
    assert res["checkpoint basal-1.0"]["error"] == "OSError: no space left on device"
    text = gpu_check.summary({"P3": res})
    assert "basal-1.5" in text and "NO auto_picks_gpu_path" in text and "ERROR OSError" in text
    assert "checkpoint" not in text.split("serve path")[0]  # not among the model sizes' rows
    assert not gpu_check.checks_passed({"P3": res})
    assert gpu_check.checks_passed({"P3": {"mini": GOOD, "checkpoint basal-1.5": CHECKPOINT}})


def test_the_dry_run_checks_one_checkpoint_layout(report, monkeypatch):
    layouts = []
    monkeypatch.setattr(gpu_check, "model_checks", lambda size, device, dry: dict(GOOD))
    monkeypatch.setattr(gpu_check, "checkpoint_checks", lambda device, dry, bias: layouts.append(bias) or CHECKPOINT)
    gpu_check.phase_model(CPU, True, ["toy"], report, math.inf)
    gpu_check.phase_model(CPU, False, ["mini"], report, math.inf)
    assert layouts == [True, False, True]  # dry: basal-1.0 (biases); on the device both


def test_a_size_that_does_not_fit_the_budget_is_skipped_and_said(report, monkeypatch):
    ran = []
    monkeypatch.setattr(gpu_check, "model_checks", lambda size, device, dry: ran.append(size) or dict(GOOD))
    deadline = gpu_check.time.perf_counter() + 30  # mini needs 20 s, 4.5B 35 s
    res = gpu_check.phase_model(CPU, False, ["mini", "4.5B"], report, deadline)
    assert ran == ["mini"]
    assert "s of the budget left" in res["4.5B"]["skipped"]


def test_the_table_names_failures_skips_rates_and_gemm_fractions():
    phases = {
        "P0": {"copy_TBps": 4.0, "mm_TFLOPs": 800.0},
        "P2": {"f16/mini": {"bitwise_equal": True, "timing": {"tokens": 4096, "ms": 1.5, "TFLOPs": 200.0}}},
        "P1": {"shapes": {"2048x1536": {"gemm": "lt", "timings": {
            "lt@16": {"TBps": 2.0, "TFLOPs": 1.0}, "lt@8192": {"TBps": 0.5, "TFLOPs": 400.0},
            "tri@16": {"TBps": 9.0, "TFLOPs": 9.0},
        }}}},
        "P3": {"mini": GOOD, "4.5B": {"error": "RuntimeError: boom"}, "max": {"skipped": "10 s of the budget left"},
               "toy": {**GOOD, "bitwise": {"eager=graph": True, "=in_batch": False}}},
    }  # fmt: skip
    text = gpu_check.summary(phases)
    assert "900 / 1500" in text and "0.75 ms" in text  # mini's floor: 3.0 GB at 4 TB/s
    assert "ERROR RuntimeError: boom" in text and "10 s of the budget left" in text
    assert "NO =in_batch" in text
    assert "2.500           2.000     1.25x" in text  # single decisions one by one vs two in flight
    assert "f16/mini" in text and "200.0   (0.25)" in text
    assert "2.00 (0.50)" in text and "400.0 (0.50)" in text  # the chosen GEMM's rows, not tri's


def test_a_saved_report_prints_its_table(tmp_path, capsys, monkeypatch):
    saved = tmp_path / "gpu_check.json"
    saved.write_text(json.dumps({"meta": {}, "phases": {"P3": {"mini": GOOD}}}))
    monkeypatch.setattr("sys.argv", ["gpu_check.py", "--table", str(saved)])
    assert gpu_check.main() == 0
    assert "900 / 1500" in capsys.readouterr().out


def test_host_work_bench_prints_a_row_per_batch(capsys, monkeypatch):
    from bench.lab import gpu_host_work

    monkeypatch.setattr("sys.argv", ["gpu_host_work.py", "--questions", "1,3", "--reps", "2"])
    gpu_host_work.main()
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [int(r.split()[0]) for r in rows] == [1, 3]
    assert all(float(r.split()[3]) > 0 for r in rows)  # tile plan + blob, ms


def test_launched_kernels_reads_the_jit_caches_and_the_table_lists_them(monkeypatch):
    """What the driver loaded per kernel (read from each JITFunction's per-device cache) goes into P4 and the
    table; nothing launched (this process, or the interpreter) gives no rows."""
    from types import SimpleNamespace

    from bench.checks import sm90_compile

    assert not any(gpu_check.launched_kernels().values())  # the real kernels, never launched here
    assert gpu_check.kernel_lines(gpu_check.launched_kernels()) == []

    def compiled(regs, spills, bm):
        # Triton 3.6 keeps an entry for every specialised argument: an unaligned one (M here) has an empty list
        src = SimpleNamespace(constants={(3,): bm}, attrs={(0,): [["tt.divisibility", 16]], (2,): []})
        md = SimpleNamespace(num_warps=4, num_stages=4, shared=65536)
        return SimpleNamespace(src=src, metadata=md, n_regs=regs, n_spills=spills)

    fake = SimpleNamespace(
        arg_names=["x_ptr", "w_ptr", "M", "BM"],
        device_caches={0: ({"a": compiled(64, 0, 64), "b": compiled(114, 8, 128)}, None, None, None, None)},
    )
    monkeypatch.setattr(sm90_compile, "kernel_function", lambda name: fake if name == "gemm" else object())
    kernels = gpu_check.launched_kernels()
    assert [v["constexprs"] for v in kernels["gemm"]] == [{"BM": "64"}, {"BM": "128"}]
    assert kernels["gemm"][0]["divisible"] == ["x_ptr"] and kernels["attention"] == []
    table = gpu_check.summary({"P4": {"kernels": kernels}})
    assert "kernels launched" in table and "gemm" in table and " 64-114 " in table and "attention" not in table


def test_a_failing_extra_p1_check_is_recorded_and_shown_without_costing_the_others():
    failed = gpu_check.isolated(lambda: 1 / 0)
    assert failed["error"].startswith("ZeroDivisionError") and "traceback" in failed
    assert gpu_check.isolated(lambda: {"ok": True}) == {"ok": True}
    table = gpu_check.summary({"P1": {"bias": failed, "swiglu_warps": {"toy": {"w4@16_ms": 1.0, "same_bits": True}}}})
    assert "GEMMs with a bias (basal-1.0, 4.5B shapes): ERROR ZeroDivisionError" in table
    assert "fused SwiGLU GEMM, ms at" in table and "1.000" in table


def test_clocks_without_nvidia_smi_are_a_line_not_a_failed_phase(monkeypatch):
    import subprocess

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert gpu_check.read_clocks().startswith("not read: FileNotFoundError")


def test_a_failed_bitwise_check_records_how_the_values_differ():
    """One GPU run must say whether a failure is a last-bit difference or a wrong value."""
    import numpy as np

    a = np.array([[1.0, 2.0, np.nan], [4.0, 5.0, 6.0]], dtype=np.float32)
    b = a.copy()
    assert gpu_check.difference(a, b) == {"differing": 0, "of": 6, "max_abs": 0.0, "first_index": None}
    b[1, 1] = np.nextafter(np.float32(5.0), np.float32(6.0))
    d = gpu_check.difference(a, b)
    assert d["differing"] == 1 and d["first_index"] == 4 and 0 < d["max_abs"] < 1e-6
    assert gpu_check.difference(a, b[:1]) == {"shapes": [[6], [3]]}
    # bit patterns, as the check compares them: -0.0 against 0.0 and two NaN payloads differ, by nothing
    signed = np.array([0.0, 1.0, np.nan], dtype=np.float32)
    flipped = np.array([-0.0, 1.0, np.nan], dtype=np.float32)
    flipped[2:].view(np.uint32)[:] |= 1  # another NaN payload
    assert gpu_check.difference(signed, flipped) == {
        "differing": 2, "of": 3, "max_abs": 0.0, "first_index": 0, "nan": 1
    }  # fmt: skip
    half = np.array([0.0, 2.0], dtype=np.float16)
    assert gpu_check.difference(half, -half)["differing"] == 2  # f16 (P2's outputs) at their own width
    phases = {"P3": {"mini": {**GOOD, "bitwise": {"=in_batch": False}, "differences": {"=in_batch": d}}}}
    text = gpu_check.summary(phases)
    assert "bitwise checks that failed" in text and "mini =in_batch: 1 of 6 values differ" in text
    nan = {"=graph": gpu_check.difference(signed, flipped)}
    assert "toy =graph: 2 of 3 values differ, by up to 0 (1 with a NaN)" in gpu_check.summary(
        {"P3": {"toy": {**GOOD, "differences": nan}}}
    )
    assert "bitwise checks that failed" not in gpu_check.summary({"P3": {"mini": GOOD}})


def test_basal_serve_over_http_is_in_the_table_and_the_verdict(monkeypatch):
    text = gpu_check.summary({"P3": {"mini": GOOD, "serve": SERVE}})
    assert "basal serve over HTTP (torch cuda:0 f16, gpu (Triton kernels)): ready in 12.5 s" in text
    assert (
        "3.25 ms over HTTP (p90 4.50), compute 1.75 ms; 16 requests at once in batches of up to 9; checks yes" in text
    )
    assert "serve" not in text.split("basal serve over HTTP")[0]  # not among the model sizes' rows
    failed = {**SERVE, "checks": {"cuda_path": False, "systemone_200": True}}
    assert "checks NO cuda_path" in gpu_check.summary({"P3": {"serve": failed}})
    assert not gpu_check.checks_passed({"P3": {"serve": failed}})
    skipped = {"skipped": "basal serve's packages are not importable"}
    assert gpu_check.checks_passed({"P3": {"serve": skipped}})  # the image without the wheels: said, not failed
    assert "basal serve over HTTP: basal serve's packages are not importable" in gpu_check.summary(
        {"P3": {"serve": skipped}}
    )


def test_the_device_command_runs_the_check_and_keeps_its_log(tmp_path):
    """bench/checks/gpu_run.sh, the one command a GPU window runs: the check's report and log land in $OUT and its exit
    code comes back (here a dry run of P0; without CUDA and without --cpu-dry-run, gpu_check's 2)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(gpu_check.ROOT)
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "bench/checks/gpu_run.sh", "--cpu-dry-run", "--phases", "0"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["phases"]["P0"]["versions"]["triton"]
    assert "[P0]" in (tmp_path / "log.txt").read_text()
    if not torch.cuda.is_available():
        plain = subprocess.run(["bash", "bench/checks/gpu_run.sh"], cwd=root, env=env, capture_output=True, timeout=300)
        assert plain.returncode == 2


def test_between_p3_items_a_backend_that_refers_to_itself_is_freed():
    """A GpuBackend is cyclic (its model holds its bound methods): without the cycle collector the weights of every
    size and checkpoint would stay on the device until the run ends."""
    import gc
    import weakref

    class Cyclic:
        def __init__(self):
            self.gemm_for = self.method

        def method(self):
            pass

    gc.disable()
    try:
        backend = Cyclic()
        alive = weakref.ref(backend)
        del backend
        assert alive() is not None  # dropping the name alone frees nothing
        gpu_check.release_memory(torch.device("cpu"))
        assert alive() is None
    finally:
        gc.enable()


def test_p1_reports_the_row_counts_serving_never_passes_beside_its_verdict():
    """The gemm verdict is taken on serving's buckets (as the backend's probe); M = 1, 2, 3, 17, ... are reported
    per GEMM, with the shapes that differ there."""
    shape = {"gemm": "lt", "timings": {}}
    gemms = {
        "2048x1536": {**shape, "any_row_count": {"lt": [False, "row 0 differs at M=2"], "tri": [True, "ok"]}},
        "1536x1536": {**shape, "any_row_count": {"lt": [True, "ok"], "tri": [True, "ok"]}},
    }
    text = gpu_check.summary({"P1": {"shapes": gemms}})
    assert "lt: 1 of 2 shapes (not: 2048x1536 row 0 differs at M=2)" in text
    assert "tri: 2 of 2 shapes" in text and "tri: 2 of 2 shapes (" not in text
    assert all(m in gpu_check.served_counts(dry=False) for m in (4, 16, 128, 1024, 8192))
    assert not {1, 2, 3, 17, 100, 129} & set(gpu_check.served_counts(dry=False))


def test_the_table_names_a_cublas_setting_that_did_not_take():
    ok = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction_split_k": False}
    assert gpu_check.settings_lines(ok) == [] and gpu_check.settings_lines({}) == []
    (line,) = gpu_check.settings_lines({**ok, "allow_fp16_reduced_precision_reduction_split_k": True})[1:]
    assert "did not take effect" in line and "split_k" in line
    wrong = {"P0": {"cublas_settings": {"allow_fp16_accumulation": True}}}
    assert "allow_fp16_accumulation" in gpu_check.summary(wrong)
