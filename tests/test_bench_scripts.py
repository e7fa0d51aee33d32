"""The benchmark scripts users are told to run still run (on the smallest settings)."""

from __future__ import annotations

import sys

import pytest

from bench import mac_check


def test_mac_check_smoke_on_cpu(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mac_check", "--device", "cpu", "--preset", "demo", "--runs", "2"])
    mac_check.main()
    out = capsys.readouterr().out
    assert "DIFFERENT" not in out and out.count(" ok") == 12
    assert "same decisions: True" in out and "decisions/s" in out


def test_bench_suite_writes_json_markdown_and_a_plot(demo_model, tmp_path):
    import json

    from basal.benchsuite.report import write
    from basal.benchsuite.suites import SUITES, Bench, model_shape

    bench = Bench(demo_model, transformers=False)
    result = SUITES["scoring"](bench)
    files = write(result, tmp_path, {"model": model_shape(demo_model)}, plot=True)
    assert [f.suffix for f in files] == [".json", ".md", ".png"] and all(f.stat().st_size > 0 for f in files)
    data = json.loads(files[0].read_text())
    assert data["model"]["name"] == demo_model.name and data["versions"]["torch"].startswith("2.13")
    engines = {row[1] for row in data["rows"]}
    assert engines == {"basal (tree)", "basal, tree off"}
    assert len(data["samples_s"]) == 6 and "speed vs tree off" in files[1].read_text()


@pytest.mark.slow
def test_multi_speed_smoke(demo_dir, tmp_path):
    from bench import multi_speed

    rows = multi_speed.main(
        [
            "--model",
            str(demo_dir),
            "--labels",
            "3",
            "--reps",
            "1",
            "--state-tokens",
            "64",
            "--out",
            str(tmp_path / "m.json"),
        ]
    )
    (row,) = rows
    assert row["labels"] == 3 and row["packed_tokens"] < row["prompt_tokens"]  # the state is computed once
    assert row["packed_tokens"] < row["separate_packed_tokens"]
