"""The ``facts`` request field on both dialects (docs/extensions.md §1.2, §1.3, §5.1, §11).

Runs right after the state is read and before any question: the state text (a string as is, other JSON as
``_text`` renders it, docs/contract.md §1.4) becomes the injected text that every question reads — prompts
and language detection alike. A failure of the computation is the request's error in the dialect's shape.

* ``/v1/basal`` follows upstream: the field must be exactly ``"off"`` or ``"auto"`` when present (``null``
  too is refused); errors are 422 ``{"error": text}``.
* ``/v1/systemone`` follows basal-rs's TypeSafe dialect: ``null`` is off; errors are 422 entries of the
  collected ``detail`` list, without ``input``/``ctx``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from basal.core.errors import ErrorList, native_refusal
from basal.core.facts.inject import FactsError, inject
from basal.core.model.render import text_of

FACTS_VALUE_ERROR = 'facts must be "off" or "auto"'


def _wants_facts(raw: dict[str, Any], null_is_off: bool) -> bool | None:
    """True for "auto", False for off, None for a value the dialect refuses."""
    if "facts" not in raw or (raw["facts"] is None and null_is_off):
        return False
    value = raw["facts"]
    if isinstance(value, str) and value in ("off", "auto"):
        return value == "auto"
    return None


def basal_state_text(raw: dict[str, Any], check: Callable[[str], None] = lambda _text: None) -> str:
    """The state text of a ``/v1/basal`` request (``raw`` has a ``state``), with facts injected if asked.
    `check(text)` sees the state text before facts are injected (facts only append: the request's size limits
    can refuse it before the scan)."""
    wants = _wants_facts(raw, null_is_off=False)
    if wants is None:
        raise native_refusal(FACTS_VALUE_ERROR)
    text = text_of(raw["state"])
    check(text)
    if not wants:
        return text
    try:
        return inject(text)
    except FactsError as e:
        raise native_refusal(str(e), e.kind) from e


def systemone_state_text(
    raw: dict[str, Any], state_ok: bool, errors: ErrorList, check: Callable[[str], None] = lambda _text: None
) -> str:
    """The state text of a ``/v1/systemone`` request; facts errors are appended to the collected `errors`.

    `state_ok`: the body has a state of a valid shape (otherwise its own error is already collected, and the
    returned text is unused); `check` as for `basal_state_text`.
    """
    wants = _wants_facts(raw, null_is_off=True)
    if wants is None:
        errors.add("literal_error", ["facts"], FACTS_VALUE_ERROR)
    if not state_ok:
        return ""
    text = text_of(raw["state"])
    check(text)
    if not wants:
        return text
    try:
        return inject(text)
    except FactsError as e:
        errors.add("value_error", ["state"], str(e))
        return text
