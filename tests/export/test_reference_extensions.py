"""check-reference on real 1.5 extension records (act, facts, multi) of an upstream export, and negative controls.

The records' items are the exporter's view (state without the facts block, act calibrated with 1.0, a multi item
with branches and no logits); ``upstream_answer`` is what the server answered. Each kind is checked where the
record carries what that needs, and everything else is a named skip, never a false mismatch.
"""

from __future__ import annotations

import copy
import json

import pytest

from basal.cli import main
from basal.export.reference import ReferenceChecker, export_manifests, manifest_temperatures
from tests.conftest import GOLDEN, golden_records

SAMPLES = "systemone-1.5-extension-samples.jsonl"
MINI = {"choice": 1.1387886347566916, "noul": 1.3939382634489992, "score": 1.5422108254079405}
NAMED_SKIPS = {  # what a record of each kind cannot show, by reason
    "m15-act-short": set(),
    "m15-facts-dates": {
        "noul answer: not checkable (facts: the record's logits are of the prompts without the facts block)",
        "usage.input_tokens: served prompts (facts block, multi branches) are tokenized only with --model",
    },
    "m15-multi-pl": {
        "multi answer probabilities: not checkable (multi: the record carries no branch logits)",
        "usage.input_tokens: served prompts (facts block, multi branches) are tokenized only with --model",
    },
}


def _write(tmp_path, records):
    """The records beside copies of both manifests, as an upstream export directory holds them."""
    for name in ("manifest.json", "manifest-1.5-mini.json"):
        (tmp_path / name).write_text((GOLDEN / name).read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / SAMPLES
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _check(tmp_path, records, temperatures=None) -> ReferenceChecker:
    checker = ReferenceChecker(temperatures=temperatures)
    checker.check_file(_write(tmp_path, records), manifests=temperatures is None)
    return checker


def _record(case_id: str) -> dict:
    (record,) = [r for r in golden_records(SAMPLES) if r["id"] == case_id]
    return record


def test_each_record_uses_its_own_models_manifest():
    assert manifest_temperatures(GOLDEN / SAMPLES, "basal-1.5-mini") == MINI
    assert manifest_temperatures(GOLDEN / SAMPLES, "basal-1.0-4.5B")["noul"] == 1.5422108254079405  # manifest.json
    assert {"basal-1.5-mini", "basal-1.5-max", "manifest.json"} <= set(export_manifests(GOLDEN / SAMPLES))


@pytest.mark.parametrize("case_id", list(NAMED_SKIPS))
def test_each_record_kind_matches_with_named_skips_only(tmp_path, case_id):
    checker = _check(tmp_path, [_record(case_id)])
    report = checker.report
    assert report.ok, report.mismatches
    assert set(report.skipped) == NAMED_SKIPS[case_id]
    if case_id == "m15-act-short":  # served: the item's run calibrated with noul's temperature, not the item's 1.0
        assert report.passed["upstream answer"] == 1 and report.passed["temperature"] == 1
        assert report.passed["usage.input_tokens"] == 1 and report.passed["probs_run_shared"] == 2
    elif case_id == "m15-facts-dates":  # the exporter's pre-facts view is checked against itself
        assert report.passed["facts state text"] == 1 and report.passed["p_cal"] == 1
        assert report.passed["prompt text"] == 2 and report.passed["answer keys"] == 1
    else:  # branch prompts from the request; selection and set confidence from upstream's own probabilities
        assert report.passed["multi branch text"] == 4 and report.passed["multi branch options"] == 4
        assert report.passed["multi decision"] == 1 and report.passed["usage.branches"] == 1


def test_cli_is_clean_on_the_samples(tmp_path, capsys):
    assert main(["check-reference", str(_write(tmp_path, golden_records(SAMPLES)))]) == 0
    assert "3 records: all match" in capsys.readouterr().out


def test_a_wrong_base_temperature_is_reported(tmp_path):
    wrong = {**MINI, "noul": 1.0}  # the exporter's view of act, as the old checker used it
    checker = _check(tmp_path, [_record("m15-act-short")], temperatures=wrong)
    assert checker.report.failed["upstream answer"] == 1


def test_a_wrong_item_temperature_is_reported(tmp_path):
    record = _record("m15-act-short")
    record["items"][0]["temperature"] = MINI["noul"]  # the exporter calibrates act with 1.0
    assert _check(tmp_path, [record]).report.failed["temperature"] == 1


def test_a_wrong_facts_block_is_reported(tmp_path):
    record = _record("m15-facts-dates")
    item = record["items"][0]
    item["state_text"] += "\n\nFakty pomocnicze (wyliczone automatycznie):\n- 3 kwietnia 2026 r. to niedziela"
    report = _check(tmp_path, [record]).report
    assert report.failed["facts state text"] == 1 and report.failed["state text"] == 1


@pytest.mark.parametrize("tamper", ["branch", "selected", "set_confidence", "branches"])
def test_a_wrong_multi_record_is_reported(tmp_path, tamper):
    record = copy.deepcopy(_record("m15-multi-pl"))
    answer = record["upstream_answer"]["answers"]["topics"]
    if tamper == "branch":
        record["items"][0]["branches"][1][0] = record["items"][0]["branches"][1][0].replace("karta", "konto")
    elif tamper == "selected":
        answer["selected"] = ["login", "address", "card"]  # upstream orders the selection by probability
    elif tamper == "set_confidence":
        answer["set_confidence"] += 1e-4
    else:
        record["upstream_answer"]["usage"]["branches"] = 3
    assert not _check(tmp_path, [record]).report.ok


def test_an_act_refusal_after_the_run_is_recomputed_from_the_items_run(tmp_path):
    """An act with max_error and no defer action: upstream fails while building the answer when the confidence is
    under the certified threshold; with thresholds the checker decides it from the item's run."""
    record = _record("m15-act-short")
    record["request"]["questions"]["fraud"]["costs"] = {
        "block": {"true": 0, "false": 5},
        "pay": {"true": 10, "false": 0},
    }
    record["request"]["questions"]["fraud"]["max_error"] = 0.01
    del record["upstream_answer"]
    record["upstream_error"] = 'ValueError: max_error needs a defer action ("defer"/"human" or defer_action)'
    strict = ReferenceChecker(temperatures=MINI, thresholds={"0.01": {"confidence": 0.99}})  # 0.9135 is under it
    strict.check_file(_write(tmp_path, [record]))
    assert strict.report.ok and strict.report.passed["upstream error"] == 1, strict.report.mismatches
    lenient = ReferenceChecker(temperatures=MINI, thresholds={"0.01": {"confidence": 0.9}})  # basal answers
    lenient.check_file(_write(tmp_path, [record]))
    assert lenient.report.failed["upstream error"] == 1
    unknown = ReferenceChecker(temperatures=MINI)  # no CALIBRATION.json: named, not guessed
    unknown.check_file(_write(tmp_path, [record]))
    assert unknown.report.ok and any("act refusal after the run" in s for s in unknown.report.skipped)


UPSTREAM_FORM_CASES = [
    "m15-mixed",
    "m15-multi-min",
    "m15-act-full",
    "m15-evidence-score-act",
    "m15-facts-euro-evidence",
    "m15-facts-none",
]


def _upstream_form(record: dict, demo_model) -> dict:
    """A basal export record rewritten as upstream's exporter writes it (the README of the golden data): one multi
    item with its branches and no logits, act items calibrated with 1.0, facts items on the state without the
    facts block, and the served run's probabilities as ``probs_run_shared``."""
    from basal.core.model.render import text_of

    request = record["request"]
    raw = text_of(request["state"])
    kinds = {name: q.get("type", "choice") for name, q in request["questions"].items()}
    items, multi = [], {}
    for it in record["items"]:
        name = it["name"].split("#")[0]
        for o in it["orders"]:
            o["probs_run_shared"] = o["probs"]
        if kinds[name] == "multi":
            if name not in multi:
                multi[name] = {"name": name, "type": "multi", "keys": [], "lang": it["lang"], "branches": []}
                multi[name]["note"] = "multi: see upstream_answer"
                items.append(multi[name])
            multi[name]["keys"].append(it["name"].split("#")[1])
            multi[name]["branches"].append([it["question_text"], it["options"]])
            continue
        it["type"] = kinds[name]
        if kinds[name] == "act":
            it["temperature"], it["p_cal"] = 1.0, it["p_avg"]
        if request.get("facts") == "auto" and it["state_text"] != raw:
            from basal.core.decision.distribution import distribution
            from basal.core.model.prompt import Item

            item = Item(name, "noul", tuple(it["keys"]), tuple(it["options"]), it["lang"], raw, it["question_text"])
            for o in it["orders"]:
                o["prompt"] = item.prompt(o["perm"], demo_model.bos)
            it["state_text"] = raw
            dist = distribution([o["letter_logits"] for o in it["orders"]], item.orders, it["temperature"])
            it["p_avg"], it["p_cal"] = dist.p_avg.tolist(), dist.p_cal.tolist()
        items.append(it)
    for it in items:
        for o in it.get("orders", []):
            o.pop("input_ids", None)  # the demo tokenizer's ids are not the real one's
    record["items"] = items
    return record


@pytest.fixture(scope="module")
def upstream_form_records(demo_model):
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline
    from tests.export.test_reference import _export_record

    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model))
    cases = {c["id"]: c for c in golden_records("systemone_cases_1.5.jsonl")}
    return {
        case_id: _upstream_form(_export_record(pipeline, demo_model, cases[case_id])[0], demo_model)
        for case_id in UPSTREAM_FORM_CASES
    }


@pytest.mark.parametrize("case_id", UPSTREAM_FORM_CASES)
def test_records_in_the_upstream_form_match_with_named_skips(tmp_path, demo_model, upstream_form_records, case_id):
    """The extension cases served by the demo model and written in the upstream exporter's form: no mismatch,
    every skip named, every answer checked as far as its record allows."""
    record = copy.deepcopy(upstream_form_records[case_id])
    calibration = demo_model.calibration
    checker = ReferenceChecker(temperatures=calibration.temperatures, thresholds=calibration.thresholds)
    checker.check_file(_write(tmp_path, [record]))
    report = checker.report
    assert report.ok, report.mismatches
    assert all(": " in reason for reason in report.skipped), report.skipped  # "what: why"
    answered = report.passed["upstream answer"] + report.passed["multi decision"] + report.passed["answer type"]
    assert answered == len(record["upstream_answer"]["answers"])
    names = {it["name"] for it in record["items"]}
    assert names == set(record["request"]["questions"])


@pytest.mark.parametrize("view", ["without branches", "branches null"])
def test_a_multi_item_without_branches_is_a_named_skip_not_a_mismatch(tmp_path, view):
    """The exporter's single yes/no item view of a multi question carries no `branches` list: nothing of the
    branches can be checked, and the report says so instead of calling the record a mismatch."""
    record = copy.deepcopy(_record("m15-multi-pl"))
    item = record["items"][0]
    if view == "without branches":
        del item["branches"]
    else:
        item["branches"] = None
    report = _check(tmp_path, [record]).report
    assert report.ok, report.mismatches
    assert "multi branches: the item is the exporter's single yes/no view (no `branches` list)" in report.skipped
    assert report.passed["keys"] == 1 and report.passed["multi decision"] == 1
    assert "multi answer probabilities: not checkable (multi: the record's item has no branches)" in report.skipped
