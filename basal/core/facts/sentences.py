"""Sentence bounds and windows of a state (docs/extensions.md §5.6).

A bound is a BOUND match (``.``, ``;``, ``!``, ``?`` before whitespace and a capital, or a newline); the
sentence index of a position is the number of bounds strictly before it. Windows are new strings, so a
search inside one sees a text edge at both ends (§5.3).
"""

from __future__ import annotations

from bisect import bisect_left

from basal.core.facts.patterns import BOUND


class Sentences:
    """The bounds of one text, found once; index and range lookups are O(log n)."""

    def __init__(self, text: str):
        self.text = text
        self.bounds = [m.start() for m in BOUND.finditer(text)]

    def index(self, position: int) -> int:
        return bisect_left(self.bounds, position)

    def range(self, i: int) -> tuple[int, int]:
        """[start, end) of sentence `i`."""
        start = self.bounds[i - 1] + 1 if i > 0 else 0
        end = self.bounds[i] if i < len(self.bounds) else len(self.text)
        return start, end


def cut(text: str, start: int, n: int) -> str:
    """``text[start:start+n]`` up to (excluding) the first bound found inside that window string."""
    window = text[start : start + n]
    m = BOUND.search(window)
    return window[: m.start()] if m else window
