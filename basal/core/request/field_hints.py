"""Misspelled field names: the nearest valid name, and the bounded list of fields a lenient dialect ignores.

`/v1/systemone` refuses an unknown field and names the nearest valid one; `/v1/basal` ignores unknown fields
as upstream does, but says so (docs/http-api.md §3, ``x-basal-warnings``). Either way the cost is bounded: a
request with thousands of unknown keys is compared a few times, by its keys' first characters only, and
lists a few of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

MAX_KEY_CHARS = 40  # field names are short: a longer key is compared by its first characters
MAX_LISTED = 5  # warnings listed per request; the rest are counted


def nearest(key: str, allowed: Iterable[str]) -> str | None:
    """The valid name closest to `key` (difflib's ratio >= 0.6), or None."""
    matches = difflib.get_close_matches(key[:MAX_KEY_CHARS], sorted(allowed), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(key: str, allowed: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` where a valid name is close to `key`, else an empty string."""
    match = nearest(key, allowed)
    return f" (did you mean {match!r}?)" if match else ""


class Warnings:
    """What a lenient request got that it did not expect: the first `MAX_LISTED`, and how many more."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.unlisted = 0

    def add(self, message: str) -> None:
        if len(self.listed) < MAX_LISTED:
            self.listed.append(message)
        else:
            self.unlisted += 1

    def ignored(self, keys: Iterable[str], allowed: frozenset[str], question: str | None = None) -> None:
        """Record every key of `keys` not in `allowed` (of the body, or of `question`); only listed ones are
        compared with the valid names."""
        for key in keys:
            if key in allowed:
                continue
            if len(self.listed) >= MAX_LISTED:
                self.unlisted += 1
                continue
            where = "" if question is None else f"question {_short(question)!r}: "
            self.listed.append(f"{where}ignored field {_short(key)!r}{did_you_mean(key, allowed)}")

    def messages(self) -> tuple[str, ...]:
        if not self.unlisted:
            return tuple(self.listed)
        return (*self.listed, f"{self.unlisted} more not listed")


def _short(name: str) -> str:
    return name if len(name) <= MAX_KEY_CHARS else name[:MAX_KEY_CHARS] + "…"
