"""check-reference on the golden samples, on records upstream rejected, and on tampered records."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from basal.cli import main
from basal.core.decision.respond import distributions
from basal.export.reference import ReferenceChecker, manifest_temperatures
from tests.conftest import DATA, GOLDEN, golden_records


def _write(tmp_path, records, name="export.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def test_golden_samples_all_match():
    temps = manifest_temperatures(GOLDEN / "systemone-sample.jsonl")
    assert temps == {"choice": 1.4983070768766815, "noul": 1.5422108254079405, "score": 2.058604473286984}
    checker = ReferenceChecker(temperatures=temps)
    for name in ("systemone-sample.jsonl", "bench-sample.jsonl"):
        checker.check_file(GOLDEN / name)
    report = checker.report
    assert report.ok, report.mismatches
    assert report.records == 10
    assert report.passed["prompt text"] == 24 and report.passed["upstream answer"] == 4
    assert report.passed["p_cal"] == 12 and report.passed["temperature"] == 12 and report.passed["packing"] == 12


UPSTREAM_ERRORS = [  # docs/contract.md §2.4: upstream's own messages for out-of-range option counts
    ("so-score-one-level", "ValueError: question 'alarm': 1 options (supported: 2..10)"),
    ("so-eleven-options", "ValueError: question 'cat': 11 options (supported: 2..10)"),
]


@pytest.mark.parametrize(("case_id", "error"), UPSTREAM_ERRORS)
def test_upstream_errors_are_reproduced(tmp_path, case_id, error):
    (case,) = [c for c in golden_records("systemone_cases.jsonl") if c["id"] == case_id]
    checker = ReferenceChecker()
    checker.check_file(_write(tmp_path, [{**case, "items": [], "upstream_error": error}]))
    assert checker.report.ok and checker.report.passed["upstream error"] == 1
    wrong = ReferenceChecker()
    wrong.check_file(_write(tmp_path, [{**case, "items": [], "upstream_error": error.replace("options", "choices")}]))
    assert not wrong.report.ok


def test_extension_records_are_skipped_not_failed(tmp_path):
    cases = [  # facts records are checked, not skipped (tests/core/facts/test_reference.py)
        {**c, "items": []} for c in golden_records("systemone_cases_1.5.jsonl") if c["request"].get("facts") != "auto"
    ]
    checker = ReferenceChecker()
    checker.check_file(_write(tmp_path, cases))
    assert checker.report.ok and sum(checker.report.skipped.values()) == len(cases)


@pytest.mark.parametrize("tamper", ["prompt", "logit", "answer", "lang", "tokens", "pack"])
def test_tampered_records_are_caught(tmp_path, tamper):
    records = golden_records("systemone-sample.jsonl")
    item = records[0]["items"][0]
    if tamper == "prompt":
        item["orders"][1]["prompt"] = item["orders"][1]["prompt"].replace("A. ", "A.  ", 1)
    elif tamper == "logit":
        item["orders"][0]["letter_logits"][0] += 1e-6  # moves the probabilities by ~5e-10, far over 1e-12
    elif tamper == "answer":
        records[0]["upstream_answer"]["answers"]["kind"]["confidence"] += 1e-5
    elif tamper == "lang":
        item["lang"] = "en"
    elif tamper == "pack":
        item["pack"]["readout_cols"][1] += 1
    else:
        records[0]["upstream_answer"]["usage"]["input_tokens"] += 1
    checker = ReferenceChecker()
    checker.check_file(_write(tmp_path, records))
    assert not checker.report.ok


def test_cli_exit_codes(tmp_path, capsys):
    assert main(["check-reference", str(GOLDEN / "systemone-sample.jsonl"), str(GOLDEN / "bench-sample.jsonl")]) == 0
    assert "10 records: all match" in capsys.readouterr().out
    records = golden_records("bench-sample.jsonl")
    records[0]["p_cal"][0] += 1e-6
    assert main(["check-reference", str(_write(tmp_path, records))]) == 1
    assert "MISMATCHES" in capsys.readouterr().out


def test_with_a_model_token_ids_are_compared(demo_dir, capsys):
    # the golden ids come from the real basal-1.5 tokenizer, so a synthetic tokenizer must be reported as different
    assert main(["check-reference", "--model", str(demo_dir), str(GOLDEN / "bench-sample.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "token ids" in out and "letter ids" in out and "temperature" in out


EXTENSION_CASES = ["m15-mixed", "m15-act-full", "m15-act-no-threshold"]


@pytest.fixture(scope="module")
def reference_pipeline(demo_model):
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline

    return Pipeline(demo_model, TorchBackend.load(demo_model))


def _export_record(pipeline, demo_model, case) -> tuple[dict, object]:
    """A reference record of one case made with the demo model (one item per readout, as exported), and its rounds."""
    import msgspec

    from basal.core.packing.passes import run_to_end
    from basal.core.request.dialects import parse_basal

    request = {**case["request"], "model": demo_model.name}
    plan = parse_basal(request, lambda _name: demo_model.name, serves_evidence=lambda _name: True)
    rounds = pipeline.first_round(plan)
    tokenized = rounds.tokenized
    pipeline.advance(rounds, run_to_end(pipeline.letter_logits(tokenized)))
    logits = rounds.plain_logits
    ids = iter(p for t in tokenized for p in t.prompts)
    items = []
    for q in plan.questions:
        rows = iter(logits[q.name])
        for item, dist in zip(q.asked, distributions(q, logits[q.name], pipeline.model.calibration), strict=True):
            orders = [
                {
                    "perm": perm,
                    "prompt": item.prompt(perm),
                    "input_ids": list(next(ids)),
                    "letter_ids": pipeline.letter_ids[: len(perm)],
                    "letter_logits": next(rows)[: len(perm)].tolist(),
                    "probs": p.tolist(),
                }
                for perm, p in zip(item.orders, dist.probs, strict=True)
            ]
            fields = ("name", "keys", "options", "lang", "state_text", "question_text")
            items.append(
                {
                    **{f: list(getattr(item, f)) if f in ("keys", "options") else getattr(item, f) for f in fields},
                    "orders": orders,
                    "temperature": demo_model.calibration.temperature(item.type),
                    "p_avg": dist.p_avg.tolist(),
                    "p_cal": dist.p_cal.tolist(),
                }
            )
    answer = msgspec.to_builtins(pipeline.respond(rounds, 0.0))
    return {**case, "request": request, "items": items, "upstream_answer": answer}, rounds


@pytest.fixture(scope="module")
def extension_records(demo_model, reference_pipeline) -> dict[str, dict]:
    """Reference records of multi/act cases made with the demo model."""
    cases = [c for c in golden_records("systemone_cases_1.5.jsonl") if c["id"] in EXTENSION_CASES]
    return {c["id"]: _export_record(reference_pipeline, demo_model, c)[0] for c in cases}


def test_evidence_records_are_checked_as_far_as_they_carry_what_is_needed(tmp_path, demo_model, reference_pipeline):
    """Spans are always checked for shape (<= 3, the state's text at their offsets); their choice only where the
    record carries the pointer head's scores, and reported as not checkable otherwise."""
    (case,) = [c for c in golden_records("systemone_cases_1.5.jsonl") if c["id"] == "m15-evidence-noul"]
    record, rounds = _export_record(reference_pipeline, demo_model, case)
    (name,) = rounds.states
    assert record["upstream_answer"]["answers"][name]["evidence"]  # the demo head found spans
    checker = ReferenceChecker(demo_model)
    checker.check_file(_write(tmp_path, [record]))
    assert checker.report.ok and checker.report.passed["evidence spans"] == 1, checker.report.mismatches
    assert "evidence span choice" not in checker.report.passed and any(
        "not checkable" in reason for reason in checker.report.skipped
    )
    states = np.asarray(rounds.states[name])
    ls, le = demo_model.evidence_head.log_scores(states[:-1], states[-1])
    rel = [list(x) for x in rounds.state_tokens[name].rel]
    record["items"][0]["evidence"] = {"rel": rel, "ls": ls.tolist(), "le": le.tolist()}
    scored = ReferenceChecker(demo_model)
    scored.check_file(_write(tmp_path, [record]))
    assert scored.report.ok and scored.report.passed["evidence span choice"] == 1, scored.report.mismatches
    for tamper in ("text", "choice"):
        bad = copy.deepcopy(record)
        span = bad["upstream_answer"]["answers"][name]["evidence"][0]
        if tamper == "text":
            span["text"] += "x"
        else:
            bad["items"][0]["evidence"]["ls"][0] += 5.0  # another start scores best
        wrong = ReferenceChecker(demo_model)
        wrong.check_file(_write(tmp_path, [bad]))
        assert not wrong.report.ok, tamper


@pytest.mark.parametrize("case_id", EXTENSION_CASES)
def test_multi_and_act_records_are_checked(tmp_path, demo_model, extension_records, case_id):
    record = copy.deepcopy(extension_records[case_id])
    checker = ReferenceChecker(demo_model)
    checker.check_file(_write(tmp_path, [record]))
    assert checker.report.ok, checker.report.mismatches
    assert checker.report.passed["upstream answer"] == len(record["request"]["questions"])
    assert checker.report.passed["prompt text"] == 2 * len(record["items"])
    assert checker.report.passed["token ids"] == 2 * len(record["items"])
    if case_id == "m15-mixed":
        assert checker.report.passed["usage.branches"] == 1
        record["upstream_answer"]["answers"]["tags"]["selected"].append("x")
    else:
        answer = next(iter(record["upstream_answer"]["answers"].values()))
        answer["expected_costs"][next(iter(answer["expected_costs"]))] += 1e-4
    wrong = ReferenceChecker(demo_model)
    wrong.check_file(_write(tmp_path, [record]))
    assert not wrong.report.ok and wrong.report.failed["upstream answer"] == 1
    # without CALIBRATION.json thresholds the refusal part of an act with max_error is not checkable
    unknown = ReferenceChecker(temperatures=demo_model.calibration.temperatures)
    unknown.check_file(_write(tmp_path, [extension_records[case_id]]))
    assert unknown.report.ok, unknown.report.mismatches


def _large_choice_records():
    lines = (DATA / "extensions" / "large_choice.jsonl").read_text().splitlines()
    vectors = [json.loads(line) for line in lines if line]
    return [v for v in vectors if v["kind"] in ("large_choice_pipeline", "e2e_model")]


def test_large_choice_records_are_checked(tmp_path):
    records = _large_choice_records()
    checker = ReferenceChecker(temperatures={"choice": 1.4983070768766815})
    checker.check_file(_write(tmp_path, records))
    report = checker.report
    assert report.ok, report.mismatches
    e2e = len(records) - 1
    assert report.passed["large-choice plan"] == e2e and report.passed["large-choice prompts"] == e2e
    for name in ("first fit", "finalists", "joint", "p_cal", "answer"):
        assert report.passed[f"large-choice {name}"] == 1, name
    assert sum(report.skipped.values()) == e2e  # e2e records carry no group distributions: said, not passed


@pytest.mark.parametrize("tamper", ["target", "finalists", "prompts", "temperature"])
def test_tampered_large_choice_records_are_caught(tmp_path, tamper):
    records = _large_choice_records()
    pipeline = next(r for r in records if r["kind"] == "large_choice_pipeline")
    e2e = next(r for r in records if r["kind"] == "e2e_model")
    if tamper == "target":
        pipeline["first_round"]["p_avg"][0] = pipeline["first_round"]["p_avg"][0][::-1]
    elif tamper == "finalists":
        pipeline["expected"]["finalists"][0] = 2
    elif tamper == "prompts":
        e2e["expected"]["prompts"] += 1
    else:
        pipeline["temperature_choice"] = 1.0
    checker = ReferenceChecker(temperatures={"choice": 1.4983070768766815})
    checker.check_file(_write(tmp_path, [pipeline, e2e]))
    assert not checker.report.ok
