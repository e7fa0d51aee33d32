"""bench/checks/gpu_check.py in a short GPU window: one failing GEMM shape or attention case costs the phase nothing
else,
P1 and P2 stop at their share of the budget, and a SIGTERM (the device tool's timeout) or a Ctrl-C still leaves the
report and prints the table of what was measured. Fakes stand in for the kernels, except in the one dry run that is
sent a SIGTERM."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from basal.backends.cuda.gpu import gemm_table as gt
from basal.core import home
from bench.checks import gpu_check

CPU = torch.device("cpu")


@pytest.fixture
def report(tmp_path):
    return gpu_check.Report(tmp_path / "gpu_check.json", {"dry_run": True})


def on_disk(report) -> dict:
    return json.loads(report.path.read_text())


@pytest.fixture
def p1_extras(monkeypatch):
    """P1's extra evidence (a child process, the bias probe, the fused SwiGLU): stand-ins that record their calls."""
    ran = []
    monkeypatch.setattr(gpu_check, "library_defaults", lambda dry: ran.append("lt") or {})
    monkeypatch.setattr(gpu_check, "bias_probe", lambda device, dry, counts, gemms: ran.append("bias") or {})
    monkeypatch.setattr(gpu_check, "swiglu_warps", lambda device, dry: ran.append("swiglu") or {})
    return ran


def probed_shape(n, k, device, dry, counts, any_counts, gemms, key, g):
    """gemm_shape's stand-in: `tri` invariant, the M regime's tiles differing from the first configuration's."""
    entry = gt.ShapeEntry(n, k, "tri", {"tri": gt.Candidate(True, None, "ok")})
    result = {"gemm": "tri", "candidates": {"tri": vars(entry.candidates["tri"])}, "any_row_count": {}, "timings": {}}
    return entry, result, {"S 64x64x64-w4-s4": gpu_check.SAME, "M 128x64x64-w4-s4": "differs"}


def test_a_failing_gemm_shape_is_recorded_and_the_others_and_the_gemm_table_survive(report, p1_extras, monkeypatch):
    def shape(n, k, *args):
        if (n, k) == (32, 64):
            raise RuntimeError("out of resources: shared memory")
        return probed_shape(n, k, *args)

    monkeypatch.setattr(gpu_check, "gemm_shape", shape)
    res = gpu_check.phase_gemm(CPU, True, report.path.parent, report, math.inf)
    failed = res["shapes"]["32x64"]
    assert failed["error"] == "RuntimeError: out of resources: shared memory"
    assert "Traceback" in failed["traceback"] and "shape" in failed["traceback"] and len(failed["traceback"]) <= 2000
    assert res["shapes"]["64x128"]["gemm"] == "tri" and p1_extras == ["lt", "bias", "swiglu"]
    table = gt.GemmTable.from_json((report.path.parent / "gemm_table.json").read_text())
    assert [(s.n, s.k, s.gemm) for s in table.shapes] == [(64, 128, "tri")]  # from the shape that was probed
    assert on_disk(report)["phases"]["P1"]["partial"]  # written after every entry
    assert res["tri_configs_equal"] == {"64x128": False}  # which configuration differed is kept:
    text = gpu_check.summary({"P1": res})
    assert "32x64           ERROR RuntimeError: out of resources" in text
    assert "64x128: M 128x64x64-w4-s4 differs" in text
    assert not gpu_check.checks_passed({"P1": res})  # a shape that was not probed fails the run


def test_every_tri_tile_configuration_is_compared_and_the_ones_that_differ_or_fail_are_named(monkeypatch):
    from basal.backends.cuda.gpu import triton_gemm

    def linear(x, w, tiles):
        if tiles.warps == 8:
            raise RuntimeError("out of resources")
        return torch.full((2, 2), 1.0 if tiles.bm == 128 else 0.0, dtype=torch.float16)

    monkeypatch.setattr(triton_gemm, "linear", linear)
    compared = gpu_check.tile_configs_compared(None, None)
    assert compared == {
        "S 64x64x64-w4-s4": "same bits",
        "S 64x32x64-w4-s5": "same bits",
        "S 64x16x64-w4-s5": "same bits",
        "M 128x64x64-w4-s4": "differs",  # the first that differs hides none after it
        "L 128x128x64-w8-s3": "RuntimeError: out of resources",
    }


def test_p1_stops_at_its_share_of_the_budget_and_says_so(report, p1_extras, monkeypatch):
    shapes = []

    def shape(n, k, *args):  # the first shape uses the rest of the budget
        shapes.append((n, k))
        monkeypatch.setattr(gpu_check, "time", SimpleNamespace(perf_counter=lambda: math.inf))
        return probed_shape(n, k, *args)

    monkeypatch.setattr(gpu_check, "gemm_shape", shape)
    res = gpu_check.phase_gemm(CPU, True, report.path.parent, report, stop=1e12)
    assert shapes == [(32, 64)] and p1_extras == []
    skipped = [res["shapes"]["64x128"], res["lt_library_defaults"], res["bias"], res["swiglu_warps"]]
    assert all(r["skipped"].startswith("time budget") for r in skipped)
    assert "64x128          time budget" in gpu_check.summary({"P1": res})
    assert gpu_check.checks_passed({"P1": res})  # skipped for time: said in the table, not a failure


def attention_calls(monkeypatch, fail_layout=None) -> list[tuple]:
    """tree_attention's stand-in: (heads, kv heads, the count's int32 offset, its address mod 16) per call."""
    from basal.backends.cuda.gpu import triton_attention

    calls = []

    def tree_attention(q, k, v, pk, pv, out, tiles, count, ranges, cfg):
        if (q.shape[1], k.shape[1]) == fail_layout:
            raise RuntimeError("illegal memory access")
        calls.append((q.shape[1], k.shape[1], count.storage_offset(), count.data_ptr() % 16))

    monkeypatch.setattr(triton_attention, "tree_attention", tree_attention)
    return calls


def test_a_failing_attention_case_is_recorded_and_the_others_run(report, monkeypatch):
    calls = attention_calls(monkeypatch, fail_layout=(8, 2))
    res = gpu_check.phase_attention(CPU, True, report, math.inf)
    assert list(res) == ["f32/G6", "f32/G8", "f32/G4", "f16/G6", "f16/G8", "f16/G4"]
    for precision in ("f32", "f16"):
        assert res[f"{precision}/G4"]["error"] == "RuntimeError: illegal memory access"
        assert "Traceback" in res[f"{precision}/G4"]["traceback"]
        assert res[f"{precision}/G8"]["bitwise_equal"] and "timing" in res[f"{precision}/G6"]
    assert set(on_disk(report)["phases"]["P2"]) == {*res, "partial"}  # written after every case
    assert "attention f16/G4: ERROR RuntimeError: illegal memory access" in gpu_check.summary({"P2": res})
    assert not gpu_check.checks_passed({"P2": res})
    assert calls


def test_p2_passes_the_readout_count_where_serving_does(report, monkeypatch):
    """model.py passes `meta["counts"][1:2]` in the last layer: an int32 4 bytes into the blob, which Triton
    compiles as another variant than a 16-byte-aligned count. P2 must check that variant."""
    calls = attention_calls(monkeypatch)
    gpu_check.phase_attention(CPU, True, report, math.inf)
    g8 = [(offset, align) for heads, kv, offset, align in calls if (heads, kv) == (8, 1)]
    per_prefix = [(0, 0), (0, 0), (1, 4)]  # alone, tree: counts[0:1]; readout-only: counts[1:2]
    assert g8 == per_prefix * (len(g8) // 3) and len(g8) == 2 * 2 * 3  # 2 precisions x 2 prefixes


def test_p2_stops_at_its_share_of_the_budget(report, monkeypatch):
    calls = attention_calls(monkeypatch)
    res = gpu_check.phase_attention(CPU, True, report, stop=time.perf_counter() - 1)
    assert not calls and all(r["skipped"].startswith("time budget") for r in res.values())


def test_a_failing_phase_keeps_its_traceback(report):
    def phase():
        raise ValueError("bad shape")

    code = gpu_check.run_phases([(1, "P1", phase)], {1}, report, {"phase": None, "started": 0.0})
    p1 = on_disk(report)["phases"]["P1"]
    assert code == 1 and p1["error"] == "ValueError: bad shape"
    assert "Traceback" in p1["traceback"] and "in phase" in p1["traceback"]
    assert "P1: ERROR ValueError: bad shape" in gpu_check.summary(on_disk(report)["phases"])


def test_a_write_interrupted_before_its_replace_leaves_the_last_report_whole(report, monkeypatch):
    report.data["phases"]["P0"] = {"copy_TBps": 1.0}
    report.write()

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check.os, "replace", interrupted)
    report.data["phases"]["P1"] = {"shapes": {}}
    with pytest.raises(KeyboardInterrupt):
        report.write()
    assert set(on_disk(report)["phases"]) == {"P0"}
    assert [p.name for p in report.path.parent.iterdir()] == ["gpu_check.json"]  # no temporary file left


def test_the_sigterm_handler_writes_the_report_and_its_table_before_it_unwinds(report, monkeypatch):
    """A SIGKILL may follow the SIGTERM before `main` is reached (a `basal serve` child shuts down on the way)."""
    current = {"phase": "P3", "started": time.perf_counter()}
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(gpu_check.Interrupted):
            gpu_check.on_sigterm(report, current, signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a second one cannot interrupt the rest
        data = on_disk(report)
        assert data["interrupted"]["phase"] == "P3" and "INTERRUPTED by SIGTERM in P3" in data["phases"]["P4"]["table"]

        def full(*args, **kwargs):
            raise OSError("no space left on device")

        monkeypatch.setattr(home.tempfile, "mkstemp", full)
        with pytest.raises(gpu_check.Interrupted):  # not the OSError: it would pass for the interrupted part's own
            gpu_check.on_sigterm(report, current, signal.SIGTERM, None)
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def dry_main(monkeypatch, tmp_path, capsys):
    """gpu_check.main() in this process, as `--cpu-dry-run --out DIR` without the interpreter patch (no kernel runs
    here), its SIGTERM handler put back after it. -> (exit code, the report, stdout)."""
    from bench.checks import interpreter_patches

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main sets it; monkeypatch removes it again
    monkeypatch.setattr(interpreter_patches, "patch_interpreter", lambda: None)
    monkeypatch.setattr(gpu_check, "launched_kernels", lambda: {})

    def run(*argv):
        monkeypatch.setattr("sys.argv", ["gpu_check.py", "--cpu-dry-run", "--out", str(tmp_path), *argv])
        before = signal.getsignal(signal.SIGTERM)
        try:
            code = gpu_check.main()
        except KeyboardInterrupt:  # not let through to pytest, which would end the session
            pytest.fail("main let a KeyboardInterrupt through")
        assert signal.getsignal(signal.SIGTERM) == before
        return code, json.loads((tmp_path / "gpu_check.json").read_text()), capsys.readouterr().out

    return run


def test_a_sigterm_writes_the_report_prints_the_table_and_exits_124(dry_main, monkeypatch):
    def phase_env(device, dry):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("the SIGTERM handler did not run")

    def no_handler(signum, frame):  # what runs if main installs none (instead of ending this test process)
        raise AssertionError("main installed no SIGTERM handler")

    monkeypatch.setattr(gpu_check, "phase_env", phase_env)
    previous = signal.signal(signal.SIGTERM, no_handler)
    try:
        code, data, out = dry_main("--phases", "0")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 124
    assert data["interrupted"]["by"] == "SIGTERM" and data["interrupted"]["phase"] == "P0"
    assert "P0" not in data["phases"] and "size   single ms" in data["phases"]["P4"]["table"]
    assert "INTERRUPTED by SIGTERM in P0 after" in out and "size   single ms" in out


def test_a_ctrl_c_does_the_same_and_exits_130(dry_main, monkeypatch):
    monkeypatch.setattr(gpu_check, "phase_env", lambda device, dry: {"copy_TBps": 2.0})

    def phase_gemm(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "phase_gemm", phase_gemm)
    code, data, out = dry_main("--phases", "0,1")
    assert code == 130 and data["interrupted"]["by"] == "KeyboardInterrupt" and data["interrupted"]["phase"] == "P1"
    assert data["phases"]["P0"]["copy_TBps"] == 2.0 and "size   single ms" in out


def test_a_failing_kernel_listing_costs_the_table_nothing(dry_main, monkeypatch):
    def launched_kernels():
        raise AttributeError("'CompiledKernel' object has no attribute 'n_regs'")

    monkeypatch.setattr(gpu_check, "launched_kernels", launched_kernels)
    code, data, out = dry_main("--phases", "4")
    assert code == 0 and "size   single ms" in out
    assert "kernels launched: ERROR AttributeError" in out
    assert "Traceback" in data["phases"]["P4"]["kernels_error"]["traceback"]
    broken = gpu_check.summary({"P3": {}, "P4": {"kernels": {"gemm": [{"warps": 4}]}}})  # no registers
    assert "size   single ms" in broken and "kernels launched: the listing failed: KeyError" in broken


def test_a_dry_run_sent_sigterm_leaves_its_report_and_table_and_exits_124(tmp_path):
    """The device tool's timeout, for real: SIGTERM to the running script once P1 has written its first shape."""
    script = gpu_check.ROOT / "bench" / "checks" / "gpu_check.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script sets it itself
    argv = [sys.executable, str(script), "--cpu-dry-run", "--out", str(tmp_path), "--phases", "0,1,2,3"]
    with (tmp_path / "log.txt").open("w+") as log:
        child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            report, data = tmp_path / "gpu_check.json", {}
            deadline = time.monotonic() + 300
            while "P1" not in data.get("phases", {}) and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                data = json.loads(report.read_text()) if report.exists() else {}
            child.send_signal(signal.SIGTERM)
            code = child.wait(timeout=120)
        finally:
            child.kill()
        log.seek(0)
        out = log.read()
    assert code == 124, out[-3000:]
    data = json.loads(report.read_text())
    assert data["interrupted"]["by"] == "SIGTERM" and data["interrupted"]["phase"] in {"P1", "P2", "P3"}
    assert data["phases"]["P0"]["versions"] and data["phases"]["P1"]["shapes"]  # what was measured is kept
    assert "size   single ms" in data["phases"]["P4"]["table"] and "INTERRUPTED by SIGTERM" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm_table.json", "gpu_check.json", "log.txt"]
