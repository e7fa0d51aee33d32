"""Text of JSON values exactly as the upstream engine shows them to the model.

Upstream renders every non-string value with Python's ``json.dumps(x, ensure_ascii=False)``: separators
``", "`` and ``": "``, request key order, float ``repr`` (``-3e-07``), non-ASCII kept, control characters
escaped. Requests are decoded with msgspec, which yields the same Python values as ``json.loads``
(ints of any size, floats, dicts in key order), so the stdlib encoder reproduces the reference byte for byte
(docs/contract.md §1.4).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # nesting accepted in request values; deeper values are refused before they are rendered


def text_of(value: Any) -> str:
    """Upstream `_text`: strings as they are, any other JSON value as Python-style JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def depth_of(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value, counting stops once `limit` is passed (no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
