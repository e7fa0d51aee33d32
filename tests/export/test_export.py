"""basal export: the three batching modes give the same bits on every backend × dtype here; torch and MLX agree in
f32; the shape-dependent path is caught; exports are byte-for-byte reproducible, resumable and readable by
check-reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from basal.backends.load import load_backend_class
from basal.cli import main
from basal.export.api import export_records
from basal.export.compare import compare_files
from basal.export.format import ExportFileError, read_export
from basal.export.reference import ReferenceChecker
from tests.conftest import GOLDEN
from tests.export.conftest import REQUESTS, combos

COMBOS = combos()


@pytest.mark.parametrize("combo", COMBOS, ids="-".join)
def test_single_batch_and_tree_are_bitwise_identical(exports, combo):
    single = exports.get(*combo, "single")
    for other in ("batch", "tree"):
        result = compare_files(single, exports.get(*combo, other), bitwise=True)
        assert result.ok, result.table()
        assert result.in_both == 6 and result.items == 9 and result.orders == 18 and result.orders_bitwise == 18
        assert result.values == 62 and result.values_differing == 0 and result.answers == 4
        assert result.errors_both == 1  # so-eleven-options is refused in every mode, with the same error


@pytest.mark.skipif(not any(c[0] == "mlx" for c in COMBOS), reason="MLX is not installed")
def test_torch_and_mlx_f32_agree_within_1e4_with_the_same_decisions(exports):
    result = compare_files(exports.get("torch", "cpu", "f32"), exports.get("mlx", "cpu", "f32"), max_logit_diff=1e-4)
    assert result.ok, result.table()
    assert result.decisions == 9 and not result.flips and result.max_abs_diff <= 1e-4
    assert result.a["backend"]["name"] == "torch" and result.b["backend"]["name"] == "mlx"


def test_negative_control_shape_dependent_path_is_not_bitwise(exports):
    """torch's plain batched GEMMs (fixed_shapes=False): packing everything together changes the bits."""
    single = exports.get("torch", "cpu", "f32", "single", fixed_shapes=False)
    tree = exports.get("torch", "cpu", "f32", "tree", fixed_shapes=False)
    result = compare_files(single, tree, bitwise=True)
    assert not result.ok
    assert 0 < result.values_differing <= result.values and result.orders_bitwise < result.orders
    assert any(f"{result.values_differing} of {result.values} letter logits differ" in f for f in result.failures)
    assert read_export(single).manifest["backend"]["options"] == {"fixed_shapes": False}


def test_same_command_twice_gives_the_same_bytes_apart_from_the_date(exports, demo_model, tmp_path):
    first = exports.get("torch", "cpu", "f32", "tree")
    again = export_records(REQUESTS, tmp_path / "again.jsonl", demo_model, "torch", "f32", batching="tree").out
    head_a, rest_a = first.read_bytes().split(b"\n", 1)
    head_b, rest_b = again.read_bytes().split(b"\n", 1)
    assert rest_a == rest_b
    manifest_a, manifest_b = json.loads(head_a)["manifest"], json.loads(head_b)["manifest"]
    assert {k: v for k, v in manifest_a.items() if k != "date"} == {k: v for k, v in manifest_b.items() if k != "date"}


def test_manifest_says_how_the_export_was_made(exports, demo_model):
    m = read_export(exports.get("torch", "cpu", "bf16", "batch")).manifest
    assert m["backend"]["name"] == "torch" and m["backend"]["dtype"] == "bf16" and m["batching"] == "batch"
    assert m["backend"]["device"] == "cpu" and m["backend"]["device_name"]
    assert set(m["versions"]) >= {"basal", "torch", "mlx", "triton"} and m["platform"]["machine"]
    assert m["model"]["name"] == demo_model.name and len(m["model"]["safetensors_sha256"]) == 64
    assert m["inputs"] == {"path": REQUESTS.name, "sha256": m["inputs"]["sha256"], "count": 6}
    assert m["calibration"]["temperatures"] == demo_model.calibration.temperatures


def test_records_hold_what_the_format_needs(exports):
    records = read_export(exports.get("torch", "cpu", "f32")).records
    structured = records["so-structured-state"]
    assert structured["dialect"] == "basal" and [it["name"] for it in structured["items"]] == [
        "kind",
        "refund",
        "urgency",
    ]
    order = structured["items"][0]["orders"][1]
    assert order["perm"] == [2, 1, 0] and len(order["letter_ids"]) == 3 == len(order["letter_logits"])
    assert all(np.float32(v) == v for v in order["letter_logits"])  # float32 values, read back exactly
    assert structured["answer"]["model"] == "basal-synthetic-demo" and structured["answer"]["usage"]["latency_ms"] == 0
    refused = records["so-eleven-options"]
    assert refused["items"] == [] and refused["error"]["status"] == 422
    assert refused["error"]["upstream"] == "ValueError: question 'cat': 11 options (supported: 2..10)"
    typesafe = records["ts-refund"]
    assert typesafe["dialect"] == "systemone" and set(typesafe["answer"]["answers"]) == {"refund", "mood", "only"}
    assert [it["name"] for it in typesafe["items"]] == ["refund", "mood"]  # a single option needs no model
    bench = records["bench-score"]
    assert bench["options"] == ["low", "medium", "high"] and bench["argmax_cal"] == int(np.argmax(bench["p_cal"]))


def test_check_reference_reads_a_basal_export(exports, demo_model):
    checker = ReferenceChecker(demo_model)
    report = checker.check_file(exports.get("torch", "cpu", "f32", "batch"))
    assert report.ok, report.mismatches
    assert report.records == 6 and report.passed["token ids"] == 18 and report.passed["upstream answer"] == 9
    assert report.passed["error"] == 1


def test_an_interrupted_export_is_finished_to_the_same_bytes(exports, demo_model, tmp_path):
    whole = exports.get("torch", "cpu", "f32", "single").read_bytes()
    cut = tmp_path / "cut.jsonl"
    lines = whole.split(b"\n")
    cut.write_bytes(b"\n".join(lines[:3]) + b"\n" + lines[3][:40])  # manifest, 2 records, half of the third
    with pytest.raises(ExportFileError, match="cut short"):
        read_export(cut)
    summary = export_records(REQUESTS, cut, demo_model, "torch", "f32")
    assert summary.resumed_from == 2 and summary.records == 6
    assert summary.manifest == json.loads(lines[0])["manifest"]
    assert cut.read_bytes() == whole  # the first run's manifest (and date) kept, the rest recomputed identically


def test_resuming_with_other_settings_is_refused(exports, demo_model, tmp_path):
    path = tmp_path / "f32.jsonl"
    path.write_bytes(exports.get("torch", "cpu", "f32").read_bytes())
    with pytest.raises(ExportFileError, match=r"other settings.*backend"):
        export_records(REQUESTS, path, demo_model, "torch", "f16")
    (tmp_path / "notes.jsonl").write_text("my notes\n")
    with pytest.raises(ExportFileError, match="not a basal export"):
        export_records(REQUESTS, tmp_path / "notes.jsonl", demo_model, "torch", "f32")


def test_bad_request_files_are_refused_before_any_work(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "request": {"state": "x", "questions": {}}}\n{"id": "a", "request": {}}\n')
    assert main(["export", str(bad), "-o", str(tmp_path / "out.jsonl"), "--quiet"]) == 2
    assert "bad.jsonl:2: id 'a' appears twice" in capsys.readouterr().err
    bad.write_text('{"id": "a", "request": {"state": "x"\n')
    assert main(["export", str(bad), "-o", str(tmp_path / "out.jsonl"), "--quiet"]) == 2
    assert "bad.jsonl:1: not valid JSON" in capsys.readouterr().err
    bad.write_text('{"id": "a", "state": "x"}\n')
    assert main(["export", str(bad), "-o", str(tmp_path / "out.jsonl"), "--quiet"]) == 2
    assert "neither a request" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_cli_export_then_compare(demo_dir, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    args = ["export", str(REQUESTS), "--model", str(demo_dir), "--backend", "torch", "--dtype", "f32", "--quiet"]
    assert main([*args, "-o", str(out), "--batching", "tree"]) == 0
    assert "wrote 6 records" in capsys.readouterr().err
    assert main(["compare", str(out), str(out), "--bitwise", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"] == {"name": "bitwise", "max_logit_diff": None, "ok": True}
    assert report["logits"]["orders_bitwise_identical"] == 18 and report["decisions"]["flips"] == []


def test_an_upstream_export_as_the_request_file_gives_upstreams_prompts(demo_model, tmp_path):
    """Its inputs are run again: the same records by id, the same prompt text (token ids need the real tokenizer)."""
    ours = export_records(GOLDEN / "bench-sample.jsonl", tmp_path / "bench.jsonl", demo_model, "torch", "f32").out
    result = compare_files(GOLDEN / "bench-sample.jsonl", ours, allow_different_models=True)
    assert result.in_both == 8 and not result.only_a and not result.only_b
    assert all(d.endswith("(input_ids)") for d in result.inputs_differing)  # prompts, perms equal; ids differ
    again = export_records(ours, tmp_path / "again.jsonl", demo_model, "torch", "f32", batching="tree").out
    assert compare_files(ours, again, bitwise=True).ok  # a basal export is a request file too


@pytest.mark.parametrize("batching", [pytest.param("single", marks=pytest.mark.slow), "tree"])
def test_multi_and_act_requests_export_one_item_per_readout_and_check(demo_model, tmp_path, batching):
    cases = [json.loads(line) for line in (GOLDEN / "systemone_cases_1.5.jsonl").read_text().splitlines()]
    chosen = [c for c in cases if c["id"] in ("m15-mixed", "m15-act-full")]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chosen))
    out = export_records(requests, tmp_path / "out.jsonl", demo_model, "torch", "f32", batching=batching).out
    records = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert [len(r["items"]) for r in records] == [1, 3 + 3]  # m15-mixed: choice, noul, score + 3 multi branches
    checker = ReferenceChecker(demo_model)
    checker.check_file(out)
    assert checker.report.ok, checker.report.mismatches
    assert checker.report.passed["upstream answer"] == 5


@pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param("mlx", marks=pytest.mark.skipif(load_backend_class("mlx") is None, reason="no MLX")),
    ],
)
def test_a_choice_with_12_options_exports_its_rounds_the_same_in_every_mode(demo_model, tmp_path, backend):
    """Its groups (round 0) and finalists (round 1) become items; single, batch and tree give the same bits."""
    criteria = {f"o{i:02d}": f"option number {i}" for i in range(12)}
    line = {
        "id": "large",
        "dialect": "systemone",
        "request": {
            "model": "MODEL",
            "state": "A state.",
            "questions": {"pick": {"type": "choice", "instructions": "Which option?", "criteria": criteria}},
        },
    }
    requests = tmp_path / "large.jsonl"
    requests.write_text(json.dumps(line) + "\n")
    outs = [
        export_records(requests, tmp_path / f"{b}.jsonl", demo_model, backend, "f32", batching=b).out
        for b in ("single", "batch", "tree")
    ]
    (record,) = read_export(outs[0]).records.values()
    rounds = [it.get("round", 0) for it in record["items"]]
    assert rounds[0] == 0 and rounds[-1] == 1 and len(rounds) >= 3  # groups, then the finalists
    assert set(record["answer"]["answers"]["pick"]["probabilities"]) == set(criteria)
    for other in outs[1:]:
        result = compare_files(outs[0], other, bitwise=True)
        assert result.ok and result.answers == 1 and result.items == len(rounds), result.table()
