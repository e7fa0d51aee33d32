"""basal compare: golden upstream records against themselves, tampered exports, and files it must refuse."""

from __future__ import annotations

import json

import pytest

from basal.cli import main
from basal.export.compare import DifferentModels, compare_files
from basal.export.format import ExportFileError
from tests.conftest import GOLDEN


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path, lines):
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.fixture
def export_a(exports):
    return exports.get("torch", "cpu", "f32")


@pytest.mark.parametrize("name", ["systemone-sample.jsonl", "bench-sample.jsonl"])
def test_golden_upstream_records_against_themselves(name):
    result = compare_files(GOLDEN / name, GOLDEN / name, bitwise=True)
    assert result.ok, result.table()
    assert result.model["same"] is True  # from the manifest.json beside the files
    assert result.orders == result.orders_bitwise > 0 and result.decisions == result.items > 0
    if name.startswith("systemone"):
        assert result.answers == 2  # upstream_answer is compared like basal's answer


def test_upstream_export_and_a_demo_model_export_are_different_models(export_a, capsys):
    with pytest.raises(DifferentModels, match="--allow-different-models"):
        compare_files(GOLDEN / "systemone-sample.jsonl", export_a)
    assert main(["compare", str(GOLDEN / "systemone-sample.jsonl"), str(export_a)]) == 2
    assert "different models" in capsys.readouterr().err
    result = compare_files(GOLDEN / "systemone-sample.jsonl", export_a, allow_different_models=True)
    assert not result.ok and result.in_both == 2  # so-structured-state and so-ten-options are in both files
    assert result.inputs_differing and "input_ids" in result.inputs_differing[0]  # another tokenizer


def test_decision_flips_are_listed_with_their_margins(export_a, tmp_path):
    lines = _lines(export_a)
    item = lines[1]["items"][0]
    assert lines[1]["id"] == "so-structured-state"
    top = max(range(3), key=lambda i: item["p_cal"][i])
    other = (top + 1) % 3
    item["p_cal"][top], item["p_cal"][other] = item["p_cal"][other], item["p_cal"][top]
    result = compare_files(export_a, _write(tmp_path / "b.jsonl", lines))
    assert not result.ok and result.failures == ["1 decisions differ"]
    (flip,) = result.flips
    assert flip["id"] == "so-structured-state" and flip["item"] == "kind"
    assert flip["a"] == item["keys"][top] and flip["b"] == item["keys"][other]
    assert flip["margin_a"] == pytest.approx(flip["margin_b"]) and flip["margin_a"] > 0


def test_tolerance_and_bitwise_policies(export_a, tmp_path):
    lines = _lines(export_a)
    order = lines[1]["items"][1]["orders"][0]
    order["letter_logits"][0] += 1e-3  # far over float32 resolution at these magnitudes
    b = _write(tmp_path / "b.jsonl", lines)
    assert compare_files(export_a, b).ok  # decisions only: the same
    loose, tight, bits = (
        compare_files(export_a, b, max_logit_diff=1e-2),
        compare_files(export_a, b, max_logit_diff=1e-4),
        compare_files(export_a, b, bitwise=True),
    )
    assert loose.ok and not tight.ok and not bits.ok
    assert tight.max_abs_diff == pytest.approx(1e-3, rel=1e-3) and tight.values_differing == 1
    assert any("max |Δ letter logit|" in f for f in tight.failures)
    assert any("1 of 62 letter logits differ" in f for f in bits.failures)


def test_mismatched_ids_and_a_request_failing_in_one_export_only(export_a, tmp_path, capsys):
    lines = _lines(export_a)
    lines[2]["id"] = "renamed"
    lines[3] = {**lines[3], "items": [], "error": {"status": 422, "body": {"error": "boom"}}}
    lines[3].pop("answer")
    b = _write(tmp_path / "b.jsonl", lines)
    result = compare_files(export_a, b)
    assert result.only_a == ["so-array-state-en"] and result.only_b == ["renamed"]
    assert result.failed_one_side == ["so-ten-options (fails in B)"]
    assert not result.ok and len(result.failures) == 3
    assert main(["compare", str(export_a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "policy decisions: FAIL" in out and "fails in one export only: so-ten-options" in out


def test_truncated_and_incomplete_files_are_refused(export_a, tmp_path, capsys):
    text = export_a.read_text(encoding="utf-8")
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 30], encoding="utf-8")
    with pytest.raises(ExportFileError, match="cut short"):
        compare_files(export_a, cut)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(text.splitlines(keepends=True)[:4]), encoding="utf-8")
    with pytest.raises(ExportFileError, match="3 of the 6 records"):
        compare_files(short, export_a)
    assert main(["compare", str(export_a), str(short)]) == 2
    assert "run the same `basal export` command again" in capsys.readouterr().err


def test_different_models_by_manifest_hash(export_a, tmp_path):
    lines = _lines(export_a)
    lines[0]["manifest"]["model"]["safetensors_sha256"] = "0" * 64
    b = _write(tmp_path / "b.jsonl", lines)
    with pytest.raises(DifferentModels, match="safetensors_sha256"):
        compare_files(export_a, b)
    result = compare_files(export_a, b, bitwise=True, allow_different_models=True)
    assert result.ok and result.model["same"] is False and "DIFFERENT" in result.table()


def test_duplicate_ids_and_records_without_one(export_a, tmp_path):
    lines = _lines(export_a)
    with pytest.raises(ExportFileError, match="appears twice"):
        compare_files(export_a, _write(tmp_path / "dup.jsonl", [*lines, lines[1]]))
    nameless = {k: v for k, v in lines[1].items() if k != "id"}
    with pytest.raises(ExportFileError, match="neither an id nor an index"):
        compare_files(export_a, _write(tmp_path / "noid.jsonl", [lines[0], nameless]))


def test_how_the_exports_were_computed_is_compared(export_a, tmp_path):
    """The manifests record the torch backend's compute facts; compare names each one that differs, so a run on
    another machine can see why bits differ (here: threads, one GEMM's chunk rows, the compiled kernels)."""
    lines = _lines(export_a)
    compute = lines[0]["manifest"]["backend"]["compute"]
    assert {"threads", "gemm_chunks", "attention_gemm_rows", "cpu_kernels"} <= set(compute)
    assert compare_files(export_a, export_a).compute_differences == []
    shape = next(iter(compute["gemm_chunks"]))
    rows, threads, kernels = compute["gemm_chunks"][shape]["rows"], compute["threads"], compute["cpu_kernels"]
    compute["threads"] = threads + 14
    compute["gemm_chunks"][shape]["rows"] = rows // 2
    other = compute["cpu_kernels"] = "off" if kernels != "off" else "compiled"
    result = compare_files(export_a, _write(tmp_path / "b.jsonl", lines))
    assert result.ok  # the records are the same: only how they were computed differs
    assert result.compute_differences == [
        f"compute.cpu_kernels: {kernels} vs {other}",
        f"compute.gemm_chunks.{shape}.rows: {rows} vs {rows // 2}",
        f"compute.threads: {threads} vs {threads + 14}",
    ]
    assert "how the two were computed differs" in result.table()
    assert result.to_json()["compute_differences"] == result.compute_differences
