"""The linear-time amount scanner finds exactly Python's matches, and does not retry inside a chain of groups."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.facts import scan
from basal.core.facts.patterns import AMOUNT, EURO, EURO_X_RATE, STATED, TIER

SCANNED = [(AMOUNT, " "), (STATED, "[ \u00a0]"), (EURO, "[ \u00a0]"), (EURO_X_RATE, "[ \u00a0]"), (TIER, "[ \u00a0]")]
PIECES = [
    "1",
    "12",
    "000",
    "123",
    "1234",
    " ",
    "\u00a0",
    ",",
    ",5",
    ",50",
    "zł",
    " zł",
    "PLN",
    " euro",
    "EUR",
    "€",
    " × ",
    "*",
    "4,31 zł",
    " netto",
    " za sztukę",
    " od ",
    " do ",
    "20",
    " szt.",
    "-",
    ".",
    "a",
    "٣",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_same_matches_as_finditer(parts):
    text = "".join(parts)
    for pattern, separator in SCANNED:
        want = [(m.span(), m.groups()) for m in pattern.finditer(text)]
        assert [(m.span(), m.groups()) for m in scan.skipping_finditer(pattern, text, separator)] == want
        assert [(m.span(), m.groups()) for m in scan.finditer(pattern, text, separator)] == want


class CountingPattern:
    def __init__(self, pattern: re.Pattern[str]):
        self.pattern, self.tries = pattern, 0

    def match(self, text: str, pos: int):
        self.tries += 1
        return self.pattern.match(text, pos)


@pytest.mark.parametrize(("pattern", "separator"), SCANNED, ids=["AMOUNT", "STATED", "EURO", "EURO_X_RATE", "TIER"])
def test_one_try_per_chain_of_groups(pattern, separator):
    counting = CountingPattern(pattern)
    text = ("1" + " 000" * 5000 + ". ") * 3  # Python's finditer retries at each of the 15 000 groups
    assert list(scan.finditer(counting, text, separator)) == [] and counting.tries == 3


def test_texts_without_long_chains_take_pythons_loop():
    counting = CountingPattern(STATED)
    counting.finditer = STATED.finditer
    text = "1" + " 000" * scan.SHORT_CHAIN + " zł, 5 zł"
    assert [m.group(1) for m in scan.finditer(counting, text)] == ["1" + " 000" * scan.SHORT_CHAIN, "5"]
    assert counting.tries == 0
