"""Every facts vector: the injected state byte for byte, the asserted lines, the error texts (docs/extensions.md §5)."""

from __future__ import annotations

import pytest

from basal.core.facts import FactsError, fact_lines, inject
from tests.core.facts.vectors import vectors

INJECT = vectors("inject")
LINES = vectors("facts_lines")


def test_the_vectors_are_all_here():
    assert len(INJECT) == 293 and len(LINES) == 16
    assert sum("expected_error" in v for v in INJECT) == 6


@pytest.mark.parametrize("vector", INJECT, ids=[v["id"] for v in INJECT])
def test_inject(vector):
    if "expected_error" in vector:
        with pytest.raises(FactsError) as e:
            inject(vector["state"])
        assert str(e.value) == vector["expected_error"]
    else:
        assert inject(vector["state"]) == vector["expected"]


def _holds(op: str, value, lines: list[str], injected: str, state: str) -> bool:
    if op == "contains_line":
        return value in lines
    if op == "lines_equal":
        return lines == value
    if op == "no_line_contains":
        return not any(value in line for line in lines)
    if op == "no_line_startswith":
        return not any(line.startswith(tuple(value)) for line in lines)
    if op == "any_line_startswith":
        return any(line.startswith(value) for line in lines)
    if op == "first_line_startswith":
        return bool(lines) and lines[0].startswith(value)
    if op == "inject_contains":
        return value in injected
    if op == "block_contains_none":
        return not any(v in injected[len(state) :] for v in value)
    raise AssertionError(f"unknown assertion {op}")


@pytest.mark.parametrize("vector", LINES, ids=[v["id"] for v in LINES])
def test_facts_lines(vector):
    lines, injected = fact_lines(vector["state"]), inject(vector["state"])
    for a in vector["asserts"]:
        if a["op"] != "note":
            assert _holds(a["op"], a["value"], lines, injected, vector["state"]), a


def test_the_line_checks_can_fail():
    state = LINES[0]["state"]
    lines = fact_lines(state)
    assert not _holds("contains_line", "1 000,00 zł > 2,00 zł", lines, inject(state), state)
    assert not _holds("lines_equal", [], lines, inject(state), state)
