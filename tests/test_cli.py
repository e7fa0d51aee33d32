"""The `basal` command as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

from basal.cli import main


def test_synth_model_then_decide(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["synth-model", "--out", str(out), "--preset", "demo", "--seed", "3", "--quiet"]) == 0
    request = tmp_path / "req.json"
    request.write_text(
        json.dumps(
            {
                "model": "basal-synthetic-demo",
                "state": "Zamówienie dotarło uszkodzone.",
                "questions": {"r": {"type": "noul", "instructions": "Czy zwrot?"}},
            }
        )
    )
    capsys.readouterr()
    assert main(["decide", "--model", str(out), "--timing", str(request)]) == 0
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert answer["answers"]["r"]["type"] == "noul" and 0 <= answer["answers"]["r"]["noul"] <= 1
    assert "carry no meaning" in captured.err and "computed" in captured.err and "forward" in captured.err


def test_synth_model_with_biases_writes_the_basal_1_0_layout_and_decides(tmp_path, capsys):
    out = tmp_path / "biased"
    assert main(["synth-model", "--out", str(out), "--bias", "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["attention_bias"] is True and config["mlp_bias"] is True
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"state": "Order 7 arrived late.", "questions": {"q": {"type": "noul"}}}))
    assert main(["decide", "--model", str(out), "--dialect", "basal", str(request)]) == 0
    assert "with biases" in capsys.readouterr().err


def test_decide_refusal_prints_the_body(tmp_path, capsys, demo_dir):
    request = tmp_path / "bad.json"
    request.write_text(json.dumps({"state": "x", "questions": {"q": {"type": "score", "criteria": ["a"]}}}))
    assert main(["decide", "--model", str(demo_dir), "--dialect", "basal", str(request)]) == 1
    assert json.loads(capsys.readouterr().out) == {"error": "question 'q': 1 options (supported: 2..10)"}


def test_decide_uses_the_demo_model_by_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BASAL_HOME", str(tmp_path))
    request = tmp_path / "req.json"
    request.write_text(
        json.dumps(
            {
                "model": "jev-latest",
                "state": "x",
                "questions": {"c": {"type": "choice", "criteria": {"a": None, "b": None}}},
            }
        )
    )
    assert main(["decide", str(request)]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "basal-synthetic-demo"
    assert (tmp_path / "models").is_dir()


def test_bad_model_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["decide", "--model", str(tmp_path / "nope"), "-"]) == 2
    assert "no such model directory" in capsys.readouterr().err


def test_doctor_lists_paths_and_verifies_them(demo_dir, capsys):
    assert main(["doctor", "--model", str(demo_dir)]) == 0
    out, err = capsys.readouterr()
    assert "doctor: checking [1/6] torch-cpu-f32" in err and "doctor: checking [6/6] mlx-cpu-bf16" in err  # progress
    assert "torch  cpu" in out and "mlx    cpu" in out and "Metal:" in out and "CUDA:" in out
    assert "torch-cpu-f32    verified" in out and "mlx-cpu-f32      verified" in out
    assert "NOT INVARIANT" not in out
    from basal.backends.cuda.cpu import cpu_kernels

    assert f"compiled CPU kernels (torch CPU attention and SwiGLU): {cpu_kernels.status()}" in out
    assert "    attention tile GEMMs: " in out
    line = "    state cache: miss = hit = off, bitwise (8 hits, 7 misses; evidence questions too)"
    assert out.count(line) == 6  # every path checks it, evidence questions too (a miss, then two hits)


def test_doctor_says_which_torch_path_serves_on_cuda(monkeypatch):
    """On a CUDA machine the doctor names the path that will serve: the GPU path with Triton, else the portable
    one, with what to install."""
    import importlib.util

    import torch

    from basal.doctor import cuda_line

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_line() == "CUDA: not available"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    assert cuda_line().startswith("CUDA: available: NVIDIA H200; the GPU path serves")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    assert "portable torch path serves" in cuda_line() and "pip install 'basal-bitwise[cuda]'" in cuda_line()


def test_a_missing_request_file_is_a_message_not_a_traceback(tmp_path, capsys):
    assert main(["decide", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "No such file or directory" in err and "missing.json" in err and "Traceback" not in err


def test_decide_timing_includes_the_load_time(tmp_path, capsys, demo_dir):
    request = tmp_path / "r.json"
    request.write_text(
        json.dumps({"model": "x", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}})
    )
    assert main(["decide", "--model", str(demo_dir), "--timing", str(request)]) == 1  # unknown model "x"
    request.write_text(
        json.dumps({"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}})
    )
    assert main(["decide", "--model", str(demo_dir), "--timing", str(request)]) == 0
    assert "time: load " in capsys.readouterr().err


def test_decide_and_export_default_to_the_same_dialect(capsys):
    """One default for both commands (the lenient upstream dialect), and the documented example file exists and
    is answered in it."""
    import argparse
    from pathlib import Path

    from basal.cli import DEFAULT_DIALECT, build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    defaults = {name: subparsers.choices[name].get_default("dialect") for name in ("decide", "export")}
    assert defaults == {"decide": DEFAULT_DIALECT, "export": DEFAULT_DIALECT} == {"decide": "basal", "export": "basal"}
    example = Path(__file__).parent.parent / "examples" / "request.json"
    assert main(["decide", str(example)]) == 0
    answers = json.loads(capsys.readouterr().out)["answers"]
    team = answers["team"]  # upstream's confidence is max p (TypeSafe's is rescaled from a uniform guess)
    assert set(answers) == {"urgent", "team"} and team["confidence"] == max(team["probabilities"].values())


def test_the_demo_models_served_name_is_documented():
    from pathlib import Path

    from basal.core.model.synth import demo_model

    page = (Path(__file__).parent.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    assert f"served as **`{demo_model().name}`**" in page


def test_decide_skips_the_template_prefix_cache_and_answers_the_same_bits(capsys, monkeypatch, demo_dir):
    """One request gains nothing from caching the template prefixes (its prompts share them in the tree), so
    `decide` computes none unless asked; the answers are the same bits either way. OpenMP workers sleep between
    ops (nothing is left to run after the one request)."""
    import os
    from pathlib import Path

    from basal.backends.cuda.backend import TorchBackend

    computed: list[str] = []
    prefix = TorchBackend.prefix
    monkeypatch.setattr(
        TorchBackend, "prefix", lambda self, lang, ids: computed.append(lang) or prefix(self, lang, ids)
    )
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    example = str(Path(__file__).parent.parent / "examples" / "request.json")
    answers = []
    for flags in ([], ["--prefix-cache"]):
        assert main(["decide", "--model", str(demo_dir), "--timing", *flags, example]) == 0
        out, err = capsys.readouterr()
        answers.append({k: v for k, v in json.loads(out).items() if k != "usage"})
        assert sorted(computed) == (["en", "pl"] if flags else []), computed
        assert ("template prefix" in err) == bool(flags)
    assert answers[0] == answers[1] and answers[0]["answers"]
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_decide_loads_without_cycle_collections_and_collects_again_after(capsys, monkeypatch, demo_dir):
    """Collections over the start-up heap are what a one-request command need not pay; the request's are not."""
    import gc

    import basal.backends.load

    during: list[bool] = []
    load = basal.backends.load.load_backend
    monkeypatch.setattr(basal.backends.load, "load_backend", lambda *a: during.append(gc.isenabled()) or load(*a))
    example = str(Path(__file__).parent.parent / "examples" / "request.json")
    assert main(["decide", "--model", str(demo_dir), example]) == 0
    assert during == [False] and gc.isenabled()
    assert main(["decide", "--model", str(demo_dir / "missing"), example]) == 2 and gc.isenabled()  # a failed load
