"""The facts vectors (tests/data/extensions/facts.jsonl, a copy of the golden extension vectors)."""

from __future__ import annotations

import json

from tests.conftest import DATA

FACTS_VECTORS = DATA / "extensions" / "facts.jsonl"


def vectors(kind: str) -> list[dict]:
    records = [json.loads(line) for line in FACTS_VECTORS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in records if r["kind"] == kind]
