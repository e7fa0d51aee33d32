"""``basal facts``: what the model will read once ``facts: "auto"`` has run (docs/extensions.md §5.1, §5.2).

One state: a file's text is the state (one final newline dropped, as editors and ``echo`` add it); a file
holding a JSON object or array is a structured state, rendered as the request's ``_text`` would render it.
Many states: JSONL lines ``{"id", "state"}`` in, one line ``{"id", "output"}`` or ``{"id", "error"}`` out per
line, in order — the same format as the facts test vectors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from basal.core.facts.inject import FactsError, inject
from basal.core.model.render import text_of


def state_of_file(content: str) -> str:
    """The state text a file holds: JSON text for an object/array, else the text itself."""
    if content.lstrip().startswith(("{", "[")):
        try:
            return text_of(json.loads(content))
        except json.JSONDecodeError:
            pass  # not JSON after all: the text is the state
    return content.removesuffix("\n").removesuffix("\r")


def _result(line: str) -> tuple[dict[str, Any], bool]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return {"id": None, "error": f"not a JSON line: {e}"}, False
    if not isinstance(record, dict) or "state" not in record:
        rid = record.get("id") if isinstance(record, dict) else None
        return {"id": rid, "error": 'a line must be an object with "id" and "state"'}, False
    try:
        return {"id": record.get("id"), "output": inject(text_of(record["state"]))}, True
    except FactsError as e:
        return {"id": record.get("id"), "error": str(e)}, True


def jsonl_results(lines: Iterable[str]) -> Iterator[tuple[str, bool]]:
    """One output line per non-blank input line, and whether the input line was well formed."""
    for line in lines:
        if line.strip():
            result, well_formed = _result(line)
            yield json.dumps(result, ensure_ascii=False), well_formed
