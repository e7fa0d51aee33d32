"""A prompt longer than the model's positions, as the TypeSafe dialect reports it (the Rust engine's
``context_length_exceeded``; docs: docs/features.md).

422 ``{"error": "unsupported", "detail": [...]}`` with one entry per question whose longest prompt is too long, in
request order, at ``["body", "questions", NAME]``; a multi's branches and a large choice's groups are reported once,
under the question's name.
"""

from __future__ import annotations

from collections.abc import Sequence

from basal.core.contract import DecisionRequest
from basal.core.errors import RequestError
from basal.core.tree import TokenizedQuestion


def context_length_error(
    request: DecisionRequest, tokenized: Sequence[TokenizedQuestion], names: Sequence[str], limit: int
) -> RequestError:
    """`names[i]`: the item name of `tokenized[i]` (a question's, or ``NAME#...`` of its branches and groups)."""
    questions = [q.name for q in request.questions]
    known = set(questions)
    longest: dict[str, int] = {}
    for name, t in zip(names, tokenized, strict=True):
        parent = name if name in known else name.rsplit("#", 1)[0]
        longest[parent] = max(longest.get(parent, 0), *(len(p) for p in t.prompts))
    detail = [
        {
            "type": "context_length_exceeded",
            "loc": ["body", "questions", name],
            "msg": f"the prompt has {longest[name]} tokens, more than the maximum context length of {limit} tokens "
            f"of model {request.model}",
        }
        for name in questions
        if longest.get(name, 0) > limit
    ]
    return RequestError(422, {"error": "unsupported", "detail": detail})
