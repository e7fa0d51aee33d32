"""Whether a planned request may be computed: its work limits, checked in the order that costs least.

Characters first (before anything is tokenized: `check_chars`), then the longest prompt against the model's
positions (`check_length`) and the packed tokens against the request's budget (`check_cost`) once tokenized.

A prompt longer than the model's positions is reported on /v1/systemone as the Rust engine's
``context_length_exceeded``: 422 ``{"error": "unsupported", "detail": [...]}`` with one entry per question whose
longest prompt is too long, in request order, at ``["body", "questions", NAME]``; a multi's branches and a large
choice's groups are reported once, under the question's name. Every other limit: Jev's token-limit 400 on
/v1/systemone, upstream's 422 on /v1/basal.
"""

from __future__ import annotations

from collections.abc import Sequence

from basal.core.decision.large_choice import is_large, prompt_count
from basal.core.errors import RequestError, over_limit, systemone_unsupported
from basal.core.model.prompt import Item
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.limits import Limits, prompt_over_limit
from basal.core.request.plan import DecisionRequest, Question


def context_length_error(
    request: DecisionRequest, tokenized: Sequence[TokenizedQuestion], names: Sequence[str], limit: int
) -> RequestError:
    """`names[i]`: the item name of `tokenized[i]` (a question's, or ``NAME#...`` of its branches and groups)."""
    questions = [q.name for q in request.questions]
    known = set(questions)
    longest: dict[str, int] = {}
    for name, t in zip(names, tokenized, strict=True):
        parent = name if name in known else name.rsplit("#", 1)[0]
        longest[parent] = max(longest.get(parent, 0), *t.lengths)
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
    return systemone_unsupported(detail)


def min_prompt_chars(q: Question) -> int:
    """Characters one prompt of `q` has at least (the template around them is not counted; a large choice's
    prompts show a group of its options, so none of them is counted)."""
    item = q.item
    options = 0 if is_large(item) else sum(map(len, item.options))
    return len(item.state_text) + len(item.question_text) + options


def prompt_chars(request: DecisionRequest) -> int:
    """Characters to tokenize: every prompt repeats state and question (a large choice asks many groups)."""
    return sum(
        _prompts_of(item) * (len(item.state_text) + len(item.question_text)) + 2 * sum(map(len, item.options))
        for q in request.questions
        for item in q.asked
    )


def _prompts_of(item: Item) -> int:
    return prompt_count(len(item.options), "luce2") if is_large(item) else 2


def check_chars(request: DecisionRequest, prompt_char_limit: int, limits: Limits, context: int) -> None:
    """Refuse, before tokenizing, a prompt that cannot fit the model's positions and a request over its characters."""
    longest = max((min_prompt_chars(q) for q in request.questions if q.needs_model), default=0)
    if longest > prompt_char_limit:
        raise prompt_over_limit(request.dialect, prompt_char_limit, context)
    total_chars = prompt_chars(request)
    if total_chars > limits.max_request_chars:
        raise over_limit(
            request.dialect,
            f"the prompts of this request hold {total_chars} characters; a request may hold at most "
            f"{limits.max_request_chars} (send fewer questions or a shorter state)",
        )


def check_length(
    request: DecisionRequest, tokenized: Sequence[TokenizedQuestion], limit: int, names: Sequence[str] | None = None
) -> None:
    """Refuse a prompt longer than the model's `limit` positions (a later round is checked again once planned).
    `names`: the item name of each entry; with them /v1/systemone answers `context_length_exceeded` per question."""
    longest = max((n for t in tokenized for n in t.lengths), default=0)
    if longest > limit:
        if request.dialect == "systemone" and names is not None:
            raise context_length_error(request, list(tokenized), list(names), limit)
        raise over_limit(request.dialect, f"a prompt has {longest} tokens; the model reads at most {limit}")


def check_cost(request: DecisionRequest, cost: int, limits: Limits) -> None:
    """Refuse a request that packs more tokens than a request may compute."""
    if cost > limits.max_request_tokens:
        raise over_limit(
            request.dialect,
            f"this request packs {cost} tokens; a request may compute at most {limits.max_request_tokens} "
            "(send fewer questions or a shorter state)",
        )
