"""Bad labelled files: each a clear error naming the line, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basal.calibration.calibrate import check_enough
from basal.calibration.labelled import LabelledError, read_labelled
from basal.cli import main
from tests.calibration.labelled_data import write_labelled

MODEL = "basal-synthetic-demo"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_labelled(tmp_path / "good.jsonl", 30, 6)


def test_a_good_file_reads(good: Path) -> None:
    labelled = read_labelled(good, "systemone", MODEL)
    assert len(labelled.lines) == 30 and labelled.counts() == {"choice": 60, "noul": 60, "score": 30}
    body = json.loads(labelled.lines[0].body)
    assert body["model"] == MODEL and "id" not in body and "group" not in body
    assert all("gold" not in q for q in body["questions"].values())
    check_enough(labelled)


def _refused(path: Path, *expected: str, dialect: str = "systemone") -> str:
    with pytest.raises(LabelledError) as e:
        read_labelled(path, dialect, MODEL)
    for text in expected:
        assert text in str(e.value), str(e.value)
    return str(e.value)


def test_gold_not_among_the_options(good: Path) -> None:
    lines = _lines(good)
    lines[6]["questions"]["q1"]["gold"] = "marketing"
    _refused(_write(good, lines), "line 7:", "'q1'", "'marketing' is not among its options")


def test_a_question_without_gold(good: Path) -> None:
    lines = _lines(good)
    del lines[2]["questions"]["q0"]["gold"]
    _refused(_write(good, lines), "line 3:", "'q0' has no gold")


def test_an_unknown_question_type(good: Path, tmp_path: Path) -> None:
    lines = _lines(good)
    lines[4]["questions"]["q0"]["type"] = "rank"
    _refused(_write(tmp_path / "a.jsonl", lines), "line 5:", "not a /v1/systemone request", "rank")
    # the lenient dialect reads an unknown type as a choice with T = 1: nothing to fit
    lines = _lines(good)
    lines[4]["questions"]["q1"]["type"] = "rank"
    _refused(_write(tmp_path / "b.jsonl", lines), "line 5:", "type 'rank' has no temperature to fit", dialect="basal")


def test_duplicate_ids(good: Path) -> None:
    lines = _lines(good)
    lines[9]["id"] = lines[3]["id"]
    _refused(_write(good, lines), "line 10:", "also on line 4")


def test_a_line_of_the_other_dialect(good: Path) -> None:
    lines = _lines(good)
    lines[11]["questions"]["q0"]["option_keys"] = "hide"  # the native dialect's field: TypeSafe refuses it
    _refused(_write(good, lines), "line 12:", "not a /v1/systemone request")


def test_not_json(good: Path) -> None:
    good.write_text(good.read_text() + "{not json\n")
    _refused(good, "line 31:", "not JSON")


def test_one_label_only(good: Path) -> None:
    lines = _lines(good)
    for x in lines:
        for q in x["questions"].values():
            if q["type"] == "noul":
                q["gold"] = True
    labelled = read_labelled(_write(good, lines), "systemone", MODEL)
    with pytest.raises(LabelledError, match=r"every noul question's gold is 'true' \(first on line 1\)"):
        check_enough(labelled)


def test_three_lines(tmp_path: Path) -> None:
    labelled = read_labelled(write_labelled(tmp_path / "three.jsonl", 3, 3), "systemone", MODEL)
    with pytest.raises(LabelledError, match="3 labelled request"):
        check_enough(labelled)


def test_the_command_names_the_line_and_writes_nothing(good: Path, tmp_path: Path, capsys) -> None:
    lines = _lines(good)
    lines[6]["questions"]["q1"]["gold"] = "marketing"
    out = tmp_path / "CALIBRATION.custom.json"
    assert main(["calibrate", str(_write(good, lines)), "-o", str(out), "--quiet"]) == 2
    assert "line 7:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [good]  # no calibration, no records, no partial file
