"""``basal facts``: one state as text or JSON, and ``--jsonl`` reproducing the facts vectors byte for byte."""

from __future__ import annotations

import io
import json

from basal.cli import main
from basal.core.facts import inject
from tests.core.facts.vectors import vectors


def test_jsonl_reproduces_the_vectors(tmp_path, capsys):
    inject_vectors = vectors("inject")
    path = tmp_path / "states.jsonl"
    path.write_text("".join(json.dumps({"id": v["id"], "state": v["state"]}) + "\n" for v in inject_vectors))
    assert main(["facts", "--jsonl", str(path)]) == 0
    want = [
        json.dumps(
            {"id": v["id"], "output": v["expected"]}
            if "expected" in v
            else {"id": v["id"], "error": v["expected_error"]},
            ensure_ascii=False,
        )
        for v in inject_vectors
    ]
    assert capsys.readouterr().out.splitlines() == want


def test_jsonl_from_stdin_reports_malformed_lines_in_place(monkeypatch, capsys):
    lines = ['{"id": 1, "state": "Termin 2024-02-06."}', "not json", '{"id": 3}', '{"id": 4, "state": {"a": 1}}']
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["facts", "--jsonl", "-"]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["id"] for o in out] == [1, None, 3, 4]
    assert out[0]["output"].endswith("- 6 lutego 2024 r. to wtorek") and out[3] == {"id": 4, "output": '{"a": 1}'}
    assert "error" in out[1] and "error" in out[2]


def test_one_state_from_a_text_file_and_a_json_file(tmp_path, capsys):
    text = tmp_path / "state.txt"
    text.write_text("Doręczono 20 marca 2027 r., termin 7 dni.\n")
    assert main(["facts", str(text)]) == 0
    assert capsys.readouterr().out == inject("Doręczono 20 marca 2027 r., termin 7 dni.") + "\n"
    structured = tmp_path / "state.json"
    structured.write_text(json.dumps({"termin": "20 marca 2027 r."}))
    assert main(["facts", str(structured)]) == 0
    assert capsys.readouterr().out == inject('{"termin": "20 marca 2027 r."}') + "\n"


def test_an_upstream_error_is_a_message_and_exit_1(tmp_path, capsys):
    path = tmp_path / "state.txt"
    path.write_text("Data 31.12.9999 i 7 dni.")
    assert main(["facts", str(path)]) == 1
    assert "date value out of range" in capsys.readouterr().err


def test_the_readme_example_output(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("Dziś jest 15 kwietnia 2026 r. Towar wydano 21 marca 2026 r.\n"))
    assert main(["facts"]) == 0
    assert capsys.readouterr().out == (
        "Dziś jest 15 kwietnia 2026 r. Towar wydano 21 marca 2026 r.\n\n"
        "Fakty pomocnicze (wyliczone automatycznie, bez oceny prawnej):\n"
        "- 15 kwietnia 2026 r. to środa\n- 21 marca 2026 r. to sobota\n"
        "- Od 15 kwietnia 2026 r. do 21 marca 2026 r.: 25 dni (wcześniej)\n"
    )


def test_a_state_and_jsonl_together_are_refused(tmp_path, capsys):
    assert main(["facts", "--jsonl", "a.jsonl", "b.txt"]) == 2
    assert "not both" in capsys.readouterr().err
