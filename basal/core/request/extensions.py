"""Request fields of `multi`, `act` and `evidence` in both dialects (docs/extensions.md §1.2–§1.3, §3.1, §4.1–§4.2).

* ``/v1/basal`` follows upstream basal-serve 1.5: Python ``float()``/``int()``/``str()`` semantics, the first
  error wins, messages prefixed ``question 'NAME': `` where upstream has the prefix.
* ``/v1/systemone`` follows the Rust engine's TypeSafe dialect: JSON numbers only, every schema error collected
  (``{"type", "loc", "msg"}``, no ``input``), capability errors as ``unsupported``.

Each planner returns a `Planned` (what `plan.Question` is built from), so this module never imports the dialect
parsers and the two stay separate. The request halves of `act` (cost matrices) and `multi` (labels, branch items)
live here; their answer math is in `basal.core.decision`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from basal.core.errors import MAX_MESSAGE_CHARS, ErrorList, RequestError, cut, native_refusal, systemone_invalid
from basal.core.model.prompt import DEFAULT_YES_NO, MAX_OPTIONS, Item, lang_of, named_options
from basal.core.model.render import text_of

NO_HEAD = "evidence is not available for this model (no evidence_head.pt)"
NOT_FOR_MULTI = "evidence is not supported for multi"
EVIDENCE_OPTIONS = "evidence needs 2 to 10 options"
ACT_BASES = ("choice", "noul", "score")
NAME_CHARS = 100  # characters of one outcome or action name quoted in a message
MAX_LABELS = 1000  # basal's own bound (upstream has none): each label is two prompts over the whole state
MULTI_KEYS = frozenset(
    {"type", "instructions", "criteria", "threshold", "max", "min", "option_keys", "evidence", "objective"}
)  # objective: only "threshold" (what basal does) gets this far
ACT_KEYS = frozenset(
    {"type", "instructions", "criteria", "base", "option_keys", "costs", "defer_action", "max_error", "evidence"}
)


@dataclass(frozen=True, slots=True)
class Planned:
    """A planned multi/act question: the descriptive item, the branches asked (multi), the spec."""

    kind: str
    item: Item
    spec: MultiSpec | ActSpec
    branches: tuple[Item, ...] = ()
    deferred_error: RequestError | None = None  # upstream raises it when the answer is built, after the run


def truthy(value: Any) -> bool:
    """Python truthiness of a JSON value (the rule of both engines for `evidence`)."""
    return bool(value)


def is_number(value: Any) -> bool:
    """A finite JSON number that fits a float64 (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) < 2**1023


def rust_debug(value: str) -> str:
    """A string quoted as Rust's ``{:?}`` does (close enough for messages: escapes, control characters)."""
    quoted = json.dumps(value, ensure_ascii=False)
    return re.sub(r"\\u00([0-9a-f]{2})", lambda m: "\\u{" + m.group(1).lstrip("0") + "}", quoted)


def _cost_message(action: str, outcomes: tuple[str, ...], quote: Callable[[str], str]) -> str:
    """Names every outcome while they fit in a message; longer names are cut and the rest counted, so the
    message stays short however many or long the outcomes are."""
    shown, size = [], 0
    for z in outcomes:
        quoted = quote(cut(z, NAME_CHARS))
        if size + len(quoted) > MAX_MESSAGE_CHARS // 2:
            shown.append(f"… {len(outcomes) - len(shown)} more")
            break
        shown.append(quoted)
        size += len(quoted) + 2
    return f"costs[{quote(cut(str(action), NAME_CHARS))}] must give a cost for every outcome [{', '.join(shown)}]"


def _yes_no(lang: str, true_text: Any, false_text: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Keys and option texts of a yes/no readout; a side given as None takes the language's default."""
    yes, no = DEFAULT_YES_NO[lang]
    sides = (yes if true_text is None else text_of(true_text), no if false_text is None else text_of(false_text))
    return ("true", "false"), sides


# ---------------------------------------------------------------------------------------------------------------
# /v1/basal — upstream


def _python_error(e: Exception) -> RequestError:
    """A Python exception of float()/int()/a missing key, with upstream's own text (str of the exception)."""
    return native_refusal(str(e), type(e).__name__)


def _finite_float(name: str, field: str, value: Any) -> float:
    """Python's ``float(value)`` as upstream reads it, refusing what is not a finite number (``"nan"``, ``"inf"``,
    a 5,000-digit string): upstream answered those with null probabilities and an arbitrary action."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise _python_error(e) from e
    if not math.isfinite(number):
        shown = cut(repr(value), NAME_CHARS)
        raise native_refusal(f"question {cut(name, NAME_CHARS)!r}: {field} must be a finite number, got {shown}")
    return number


def _labels_basal(name: str, criteria: Any) -> tuple[list[str], list[str]]:
    if isinstance(criteria, list):
        if not all(isinstance(k, str) for k in criteria):
            raise native_refusal(f"question {name!r}: a criteria list must hold option names (strings)", "TypeError")
        criteria = dict.fromkeys(criteria)
    if not isinstance(criteria, dict):
        raise native_refusal(f"question {name!r}: criteria must be an object or a list", "TypeError")
    return list(criteria), [k if v is None else text_of(v) for k, v in criteria.items()]


def plan_multi_basal(
    name: str, q: dict[str, Any], state_text: str, question_text: str, lang: str | None = None
) -> Planned:
    """`lang`: the request's ``lang`` (pl / en) in place of language detection."""
    criteria = q.get("criteria")
    if not criteria:
        raise native_refusal(f"question {name!r}: multi needs criteria")
    keys, labels = _labels_basal(name, criteria)
    if len(keys) > MAX_LABELS:
        raise native_refusal(f"question {name!r}: {len(keys)} labels (basal asks at most {MAX_LABELS} per multi)")
    threshold = _finite_float(name, "threshold", q.get("threshold", 0.5))
    limits: dict[str, int | None] = {"max": None, "min": None}
    deferred = None
    for bound in ("max", "min"):  # upstream applies int() when it builds the answer: max first, then min
        if q.get(bound) is not None and deferred is None:
            try:
                limits[bound] = int(q[bound])
            except (TypeError, ValueError, OverflowError) as e:
                deferred = _python_error(e)
    lang = lang or lang_of(state_text + question_text)
    item = Item(name, "multi", tuple(keys), tuple(labels), lang, state_text, question_text)
    spec = MultiSpec(tuple(keys), threshold, limits["max"], limits["min"])
    return Planned("multi", item, spec, branch_items(name, keys, labels, lang, state_text, question_text), deferred)


def plan_act_basal(
    name: str,
    q: dict[str, Any],
    state_text: str,
    question_text: str,
    option_keys: Callable[[], str],
    lang: str | None = None,
) -> Planned:
    """Readout (§4.1), cost matrix (§4.2), then the 2..10 option check; `lang` as in `plan_multi_basal`."""
    lang = lang or lang_of(state_text + question_text)
    criteria = q.get("criteria") or {}
    base = q.get("base")
    keys: tuple[str, ...]
    if (isinstance(criteria, dict) and all(k in ("true", "false") for k in criteria)) or base == "noul":
        sides = criteria if isinstance(criteria, dict) else {}
        keys, options = _yes_no(lang, sides.get("true") or None, sides.get("false") or None)
        calibration_type, validated = "noul", True
    else:
        calibration_type = base if isinstance(base, str) and base else "choice"
        names, _ = _labels_basal(name, criteria)
        shown = criteria if isinstance(criteria, dict) else dict.fromkeys(names)
        hide = option_keys()
        keys_list, options_list = named_options(shown, hide)
        keys, options, validated = tuple(keys_list), tuple(options_list), hide == "hide"
    rows, defer = _costs_basal(name, q, keys)
    if not 2 <= len(options) <= MAX_OPTIONS:
        raise native_refusal(f"question {name!r}: {len(options)} options (supported: 2..{MAX_OPTIONS})")
    max_error = q.get("max_error")
    if isinstance(max_error, list):  # the native SDK's form: several targets, each certified on its own
        targets = _max_error_targets(name, max_error)
        spec = ActSpec(keys, rows, defer, ",".join(targets), validated, targets)
    else:
        spec = ActSpec(keys, rows, defer, None if max_error is None else str(max_error), validated)
    return Planned("act", Item(name, calibration_type, keys, options, lang, state_text, question_text), spec)


def _max_error_targets(name: str, targets: list[Any]) -> tuple[str, ...]:
    """The CALIBRATION.json keys of a ``max_error`` list (Python's ``str`` of each number, as for one target)."""
    if not targets or not all(isinstance(t, int | float) and not isinstance(t, bool) for t in targets):
        raise native_refusal(f"question {name!r}: max_error must be a number or a non-empty list of numbers")
    return tuple(str(t) for t in targets)


def _costs_basal(name: str, q: dict[str, Any], outcomes: tuple[str, ...]):
    costs = q.get("costs")
    if not isinstance(costs, dict) or not costs:
        raise native_refusal(f"question {name!r}: act needs costs")
    try:
        if all(k in ("wrong", "defer") for k in costs) and not isinstance(costs.get("wrong"), dict):
            wrong = _finite_float(name, "costs.wrong", costs["wrong"])
            defer = _finite_float(name, "costs.defer", costs["defer"]) if "defer" in costs else None
            return short_form_rows(outcomes, wrong, defer), "defer" if defer is not None else None
        rows, expected = [], set(outcomes)
        for action, row in costs.items():
            if not isinstance(row, dict) or row.keys() != expected:
                raise native_refusal(f"question {name!r}: {_cost_message(action, outcomes, repr)}")
            rows.append((action, tuple((z, _finite_float(name, "costs", c)) for z, c in row.items())))
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise _python_error(e) from e
    return tuple(rows), full_form_defer(list(costs), q.get("defer_action"))


def may_fail_after_run(spec: Any) -> bool:
    """An act question whose refusal could need a defer action it does not have: only the run can tell."""
    return isinstance(spec, ActSpec) and spec.max_error_key is not None and spec.defer_action is None


def evidence_refusal_basal() -> RequestError:
    return native_refusal(NO_HEAD)


def multi_evidence_error_basal(name: str) -> RequestError:
    """Upstream, after the run and only with a head: evidence asked on a multi question."""
    return native_refusal(f"question {name!r}: {NOT_FOR_MULTI}")


# ---------------------------------------------------------------------------------------------------------------
# /v1/systemone — the TypeSafe dialect of the Rust engine


def check_multi_evidence(questions: dict[str, Any], errors: ErrorList) -> None:
    """Collected before any question's own errors (after `facts`)."""
    for qid, q in questions.items():
        if isinstance(q, dict) and q.get("type") == "multi" and truthy(q.get("evidence")):
            errors.add("value_error", ["questions", qid, "evidence"], NOT_FOR_MULTI)


def check_multi_shape(qid: str, q: dict[str, Any], errors: ErrorList, entry: Callable[[Any, list[Any], bool], bool]):
    loc = ["questions", qid, "multi"]
    criteria = q.get("criteria")
    if not criteria:
        errors.add("missing", [*loc, "criteria"], "multi needs criteria")
    elif isinstance(criteria, list):
        for i, label in enumerate(criteria):
            if not isinstance(label, str):
                errors.add("string_type", [*loc, "criteria", str(i)], "labels must be strings")
    elif isinstance(criteria, dict):
        for key, value in criteria.items():
            entry(value, [*loc, "criteria", key], True)
    else:
        errors.add("dict_type", [*loc, "criteria"], "multi criteria must be an object or a list")
    for field in ("threshold", "max", "min"):
        if q.get(field) is not None and not is_number(q[field]):
            errors.add("float_type", [*loc, field], f"{field} must be a number")


def _act_readout_systemone(q: dict[str, Any]) -> str:
    """yes/no iff criteria ⊆ {true, false}, or base "noul", or neither criteria nor base; else the base."""
    criteria, base = q.get("criteria"), q.get("base")
    if isinstance(criteria, dict) and all(k in ("true", "false") for k in criteria):
        return "noul"
    if base == "noul" or (criteria is None and base is None):
        return "noul"
    return base if base in ACT_BASES else "choice"


def check_act_shape(qid: str, q: dict[str, Any], errors: ErrorList, entry: Callable[[Any, list[Any], bool], bool]):
    loc = ["questions", qid, "act"]
    base = q.get("base")
    if base is not None and base not in ACT_BASES:
        shown = rust_debug(base) if isinstance(base, str) else json.dumps(base, ensure_ascii=False)
        errors.add("literal_error", [*loc, "base"], f"unsupported act base {shown}")
    readout = _act_readout_systemone(q)
    criteria = q.get("criteria")
    outcomes: tuple[str, ...] | None = None
    if readout == "noul":
        outcomes = ("true", "false")
        if isinstance(criteria, dict):
            for side, value in criteria.items():
                entry(value, [*loc, "criteria", side], True)
    elif criteria is None:
        errors.add("missing", [*loc, "criteria"], "Field required")
    elif isinstance(criteria, list):
        bad = [i for i, k in enumerate(criteria) if not isinstance(k, str)]
        for i in bad:
            errors.add("string_type", [*loc, "criteria", str(i)], "labels must be strings")
        outcomes = None if bad else tuple(dict.fromkeys(criteria))
    elif isinstance(criteria, dict):
        outcomes = tuple(criteria) if all(entry(v, [*loc, "criteria", k], True) for k, v in criteria.items()) else None
    else:
        errors.add("dict_type", [*loc, "criteria"], "act criteria must be an object or a list")
    if "option_keys" in q and q["option_keys"] not in ("show", "hide"):
        errors.add("literal_error", [*loc, "option_keys"], "Input should be 'show' or 'hide'")
    _check_costs_systemone(q.get("costs"), outcomes, loc, errors)
    if q.get("max_error") is not None and not is_number(q["max_error"]):
        errors.add("float_type", [*loc, "max_error"], "max_error must be a number")
    if q.get("defer_action") is not None and not isinstance(q["defer_action"], str):
        errors.add("string_type", [*loc, "defer_action"], "defer_action must be a string")


def _check_costs_systemone(costs: Any, outcomes: tuple[str, ...] | None, loc: list[Any], errors: ErrorList) -> None:
    if not isinstance(costs, dict) or not costs:
        errors.add("missing", [*loc, "costs"], "act needs costs")
    elif _is_short_form(costs):
        for field in ("wrong", "defer"):
            if (field == "wrong" or field in costs) and not is_number(costs.get(field)):
                errors.add("float_type", [*loc, "costs", field], "cost must be a number")
    elif outcomes is not None:
        expected = set(outcomes)
        for action, row in costs.items():
            if not isinstance(row, dict) or row.keys() != expected:
                errors.add("value_error", [*loc, "costs", action], _cost_message(action, outcomes, rust_debug))
                continue
            for z, c in row.items():
                if not is_number(c):
                    errors.add("float_type", [*loc, "costs", action, z], "cost must be a number")


def _is_short_form(costs: dict[str, Any]) -> bool:
    return all(k in ("wrong", "defer") for k in costs) and not isinstance(costs.get("wrong"), dict)


def rust_max_error_key(value: float) -> str:
    """The CALIBRATION.json key of a max_error number as Rust formats an f64 (``0.01``, ``1``, ``0.0000001``)."""
    from decimal import Decimal

    text = format(Decimal(repr(float(value))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def plan_multi_systemone(
    qid: str, q: dict[str, Any], state_text: str, question_text: str, unsupported: ErrorList
) -> Planned | None:
    criteria = q["criteria"]
    if isinstance(criteria, list):
        criteria = dict.fromkeys(criteria)
    if len(criteria) > MAX_LABELS:
        unsupported.add(
            "unsupported_label_count",
            ["questions", qid, "criteria"],
            f"{len(criteria)} labels: basal asks at most {MAX_LABELS} labels per multi question",
        )
        return None
    keys = list(criteria)
    labels = [k if v is None else text_of(v) for k, v in criteria.items()]
    lang = lang_of(state_text + question_text)
    bounds = {b: None if q.get(b) is None else int(q[b]) for b in ("max", "min")}
    threshold = 0.5 if q.get("threshold") is None else float(q["threshold"])
    spec = MultiSpec(tuple(keys), threshold, bounds["max"], bounds["min"], clamp_negative=True)
    item = Item(qid, "multi", tuple(keys), tuple(labels), lang, state_text, question_text)
    return Planned("multi", item, spec, branch_items(qid, keys, labels, lang, state_text, question_text))


def plan_act_systemone(
    qid: str, q: dict[str, Any], state_text: str, question_text: str, unsupported: ErrorList
) -> Planned | None:
    """A shape-checked act question; 400 for empty criteria; more than 10 options is a capability error."""
    lang = lang_of(state_text + question_text)
    readout = _act_readout_systemone(q)
    criteria = q.get("criteria")
    option_keys = q.get("option_keys", "show")
    if readout == "noul":
        sides = criteria if isinstance(criteria, dict) else {}
        keys, options = _yes_no(lang, sides.get("true"), sides.get("false"))
        validated = True
    else:
        if not criteria:
            raise systemone_invalid(f"Choice question must have at least one choice: {cut(qid, NAME_CHARS)}")
        shown = criteria if isinstance(criteria, dict) else dict.fromkeys(criteria)
        keys_list, options_list = named_options(shown, option_keys)
        keys, options, validated = tuple(keys_list), tuple(options_list), option_keys == "hide"
        if len(options) > MAX_OPTIONS:
            unsupported.add(
                "unsupported_option_count",
                ["questions", qid, "criteria"],
                f"{len(options)} options: the letter readout of the model reads 2..{MAX_OPTIONS}; only "
                "choice questions take more (the grouped 11..255 strategy)",
            )
            return None
    costs = q["costs"]
    if _is_short_form(costs):
        defer = float(costs["defer"]) if "defer" in costs else None
        rows, defer_action = short_form_rows(keys, float(costs["wrong"]), defer), "defer" if defer is not None else None
    else:
        rows = tuple((a, tuple((z, float(c)) for z, c in row.items())) for a, row in costs.items())
        defer_action = full_form_defer(list(costs), q.get("defer_action"))
    max_error = q.get("max_error")
    spec = ActSpec(keys, rows, defer_action, None if max_error is None else rust_max_error_key(max_error), validated)
    return Planned("act", Item(qid, readout, keys, options, lang, state_text, question_text), spec)


def evidence_unsupported(qid: str, unsupported: ErrorList, msg: str = NO_HEAD) -> None:
    """Capability error of a question asking for evidence: the model has no head, or the question has options
    outside 2..10 (the Rust engine's rule)."""
    unsupported.add("unsupported_feature", ["questions", qid, "evidence"], msg)


def evidence_option_count_ok(q: dict[str, Any]) -> bool:
    """A shape-checked TypeSafe question that asks for evidence has 2..10 options (a noul always has two)."""
    if q.get("type") == "noul" or (q.get("type") == "act" and not q.get("criteria")):
        return True
    criteria = q.get("criteria")
    return isinstance(criteria, dict | list) and 2 <= len(criteria) <= MAX_OPTIONS


def needs_defer_error(qid: str, dialect: str, message: str) -> RequestError:
    """The after-the-run refusal without a defer action, worded per dialect."""
    if dialect == "basal":
        return native_refusal(message)
    errors = ErrorList()
    errors.add("value_error", ["questions", qid], message)
    return errors.refusal()


@dataclass(frozen=True, slots=True)
class ActSpec:
    """A parsed cost matrix. Rows keep request order; each row keeps its own key order (the summation order)."""

    outcomes: tuple[str, ...]
    rows: tuple[tuple[Any, tuple[tuple[str, float], ...]], ...]  # (action, ((outcome, cost), ...))
    defer_action: Any = None  # None: no defer action
    max_error_key: str | None = None  # CALIBRATION.json thresholds key; None: no max_error
    validated_readout: bool = False  # yes/no readout or option_keys "hide" (the calibration flag's condition)
    max_error_keys: tuple[str, ...] = ()  # /v1/basal max_error as a list: each target's key, all must hold


def short_form_rows(outcomes: tuple[str, ...], wrong: float, defer: float | None):
    """``{"wrong": W, "defer": D}`` -> one action per outcome (0 if right, W otherwise), then ``defer``."""
    rows = [(y, tuple((z, 0.0 if z == y else wrong) for z in outcomes)) for y in outcomes]
    if defer is not None:
        rows.append(("defer", tuple((z, defer) for z in outcomes)))
    return tuple(rows)


def full_form_defer(actions: list[Any], defer_action: Any) -> Any:
    """`defer_action` if truthy (not checked against the actions), else ``defer``, else ``human``, else none."""
    if defer_action:
        return defer_action
    for name in ("defer", "human"):
        if name in actions:
            return name
    return None


BRANCH_LINE = {"pl": "Czy dotyczy: \u201e{label}\u201d?", "en": 'Does this apply: "{label}"?'}
MIN_BRANCH_CHARS = 1 + min(len(line.format(label="")) for line in BRANCH_LINE.values())  # newline + the line


@dataclass(frozen=True, slots=True)
class MultiSpec:
    """What selection needs. `max`/`min` are already ints (None: no limit); `clamp_negative` = basal-rs rule."""

    keys: tuple[str, ...]
    threshold: float
    max: int | None = None
    min: int | None = None
    clamp_negative: bool = False


def branch_question(question_text: str, label: str, lang: str) -> str:
    """The question of one branch; the newline is there even when the instructions are empty."""
    return f"{question_text}\n{BRANCH_LINE[lang].format(label=label)}"


def branch_items(
    name: str, keys: Sequence[str], labels: Sequence[str], lang: str, state_text: str, question_text: str
) -> tuple[Item, ...]:
    """One yes/no item per label (default Tak/Nie, Yes/No options always; noul temperature)."""
    yes, no = DEFAULT_YES_NO[lang]
    return tuple(
        Item(
            f"{name}#{key}",
            "noul",
            ("true", "false"),
            (yes, no),
            lang,
            state_text,
            branch_question(question_text, label, lang),
        )
        for key, label in zip(keys, labels, strict=True)
    )
