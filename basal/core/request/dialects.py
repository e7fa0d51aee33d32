"""Request contracts of the two HTTP dialects and the answers they return.

* ``/v1/systemone`` — the TypeSafe System One API (docs/http-api.md): strict. Shape errors are
  FastAPI-style 422 lists (``{"detail": [{"type", "loc", "msg", ...}]}``, every error at once, the question
  type inside ``loc``); semantic limits are 400 with Jev's exact bodies; valid requests that basal does not
  support yet are 422 ``{"error": "unsupported", "detail": [...]}``.
* ``/v1/basal`` — the upstream basal-serve dialect (docs/contract.md §1.5, §2.3): lenient ``to_items``,
  every error 422 ``{"error": "..."}``.

Both produce the same plan, a `DecisionRequest` of `Question`s; nothing past this module sees raw JSON.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgspec

from basal.core.errors import (
    ErrorList,
    RequestError,
    native_refusal,
    systemone_invalid,
    systemone_shape,
    systemone_usage,
)
from basal.core.facts.request import basal_state_text, systemone_state_text
from basal.core.model.prompt import DEFAULT_YES_NO, MAX_OPTIONS, POLISH_CHARS, Item, named_options
from basal.core.model.render import MAX_DEPTH, depth_of, text_of
from basal.core.request import extensions as ext
from basal.core.request.field_hints import MAX_KEY_CHARS, Warnings, did_you_mean, nearest
from basal.core.request.limits import DEFAULT_LIMITS, Limits, check_model_floor, check_size_floor, echo
from basal.core.request.model_names import ServedModels
from basal.core.request.plan import DecisionRequest, Dialect, Kind, Question

MAX_CHOICES = 255  # TypeSafe's limit; 11..255 are asked in groups (decision/large_choice.py); /v1/basal keeps 2..10
MAX_LEVELS = 10


# ---------------------------------------------------------------------------------------------------------------
# The plan: what the engine runs and the answer builder needs.


def _from_planned(planned: ext.Planned, evidence: bool) -> Question:
    return Question(
        planned.kind,  # type: ignore[arg-type]
        planned.item,
        branches=planned.branches,
        spec=planned.spec,
        evidence=evidence,
        deferred_error=planned.deferred_error,
    )


# ---------------------------------------------------------------------------------------------------------------
# Answers (wire types). Field order follows the live API / upstream engine.


# ---------------------------------------------------------------------------------------------------------------
# JSON bodies

_BYTE_AT = re.compile(r"\(byte (\d+)\)")
_COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}


def _why_not_json(body: bytes) -> str | None:
    """A body that fails to decode for a reason the user can fix at once: none at all, or compressed data."""
    if not body.strip():
        return "empty body"
    for magic, encoding in _COMPRESSED_MAGIC.items():
        if body.startswith(magic):
            return f"the body is {encoding} data: set Content-Encoding: {encoding}"
    return None


def decode_body(body: bytes, dialect: Dialect) -> Any:
    """Raw body -> Python JSON value (same values as ``json.loads``), or the dialect's invalid-JSON error."""
    try:
        return msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError) as e:
        message = str(e) if isinstance(e, msgspec.DecodeError) else "JSON nested too deeply"
        reason = _why_not_json(body)
        if dialect == "basal":
            shown = message if reason is None else reason
            raise native_refusal(f"invalid JSON: {shown}", "JSONDecodeError", message) from e
        m = _BYTE_AT.search(message)
        offset = len(body[: int(m.group(1))].decode("utf-8", errors="ignore")) if m else 0
        raise systemone_shape(
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", offset],
                    "msg": "JSON decode error" if reason is None else f"JSON decode error: {reason}",
                    "input": {},
                    "ctx": {"error": message if reason is None else reason},
                }
            ]
        ) from e


# ---------------------------------------------------------------------------------------------------------------
# /v1/systemone — TypeSafe System One


def _served_hint(resolve_model: Callable[..., str | None]) -> str:
    """`` (served: ...; GET /v1/models lists them)`` after an unknown model name, where the served names are known."""
    return f" ({resolve_model.hint()})" if isinstance(resolve_model, ServedModels) else ""


class _ShapeErrors(ErrorList):
    """FastAPI/pydantic-style 422 error list, collected over the whole body (bounded by `ErrorList`), with the
    checks the dialect repeats: a missing field, an unknown one, a content value."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(limits.max_errors, limits.max_echo_chars)

    def missing(self, loc: list[Any], hint: str = "") -> None:
        self.add("missing", loc, "Field required" + hint)

    def extra(self, loc: list[Any], value: Any, allowed: frozenset[str] | tuple[str, ...]) -> None:
        """An unknown field, with the nearest valid name (computed only while the list has room)."""
        hint = "" if self.full else did_you_mean(str(loc[-1]), allowed)
        self.add("extra_forbidden", loc, "Extra inputs are not permitted" + hint, value)

    def entry(self, value: Any, loc: list[Any], nullable: bool) -> bool:
        """A content value (state, instructions, criterion): string, object or array (or null where allowed)."""
        if value is None and nullable:
            return True
        if not isinstance(value, str | dict | list):
            allowed = "a string, an object, an array or null" if nullable else "a string, an object or an array"
            self.add("entry_type", loc, f"Input should be {allowed}", value)
            return False
        if depth_of(value) > MAX_DEPTH:
            self.add("too_deep", loc, f"Value is nested deeper than {MAX_DEPTH} levels", None, max_depth=MAX_DEPTH)
            return False
        return True


SYSTEMONE_BODY_KEYS = frozenset({"model", "state", "questions", "facts"})
MAX_KEYS_COMPARED = 64  # a missing field is compared with the body's first keys only (a body may have thousands)


def _misspelled_as(field: str, raw: dict[str, Any]) -> str:
    """`` (the body has 'questons'; did you mean 'questions'?)`` for a missing top-level field, if a key is close."""
    unknown = [k[:MAX_KEY_CHARS] for k in itertools.islice(raw, MAX_KEYS_COMPARED) if k not in SYSTEMONE_BODY_KEYS]
    match = nearest(field, unknown)
    return f" (the body has {echo(match)!r}; did you mean {field!r}?)" if match else ""


def _lang(state_text: str, question_text: str) -> str:
    """`lang_of(state_text + question_text)` without copying the state once per question."""
    return "pl" if _has_polish(state_text) or _has_polish(question_text) else "en"


_last_long_text: list[tuple[str, bool]] = []  # the last long state scanned (one entry: bounded memory)
_last_long_lock = threading.Lock()


def _has_polish(text: str) -> bool:
    if len(text) < 4096:
        return not POLISH_CHARS.isdisjoint(text)
    with _last_long_lock:  # the state of a request is scanned once, not once per question
        if _last_long_text and _last_long_text[0][0] is text:
            return _last_long_text[0][1]
    found = not POLISH_CHARS.isdisjoint(text)
    with _last_long_lock:
        _last_long_text[:] = [(text, found)]
    return found


PromptBound = Callable[[str], tuple[int, int] | None]  # served model -> (prompt characters, context tokens)


def _no_bound(_model: str) -> tuple[int, int] | None:
    return None


def _asks_the_model(q: Any, dialect: Dialect) -> bool:
    """Whether the raw question surely runs the model (so each of its prompts holds the whole state): a noul, a
    multi with labels, a choice or score with two options or more. Unsure shapes say False (never a wrong 4xx)."""
    if not isinstance(q, dict):
        return False
    qtype = q.get("type", "choice" if dialect == "basal" else None)
    criteria = q.get("criteria")
    if qtype == "noul":
        return True
    if qtype == "multi":
        return isinstance(criteria, dict | list) and len(criteria) > 0
    return qtype in ("choice", "score") and isinstance(criteria, dict | list) and len(criteria) >= 2


def _size_check(
    dialect: Dialect, questions: Any, limits: Limits, bound: Callable[[], tuple[int, int] | None] = lambda: None
) -> Callable[[str], None]:
    """The request's character limits checked from sizes, given the state text before facts: every question
    asks at least two prompts over the whole state, a multi two per label, each with its branch line; and a
    question that runs the model cannot fit the model's `bound()` (prompt characters, context) if its state
    alone is longer."""

    def check(state_text: str) -> None:
        prompts = fixed = 0
        model_asked = False
        for q in questions.values() if isinstance(questions, dict) else ():
            labels = q.get("criteria") if isinstance(q, dict) and q.get("type") == "multi" else None
            n = len(labels) if isinstance(labels, dict | list) and labels else 1
            prompts += 2 * n
            fixed += 2 * n * ext.MIN_BRANCH_CHARS if n > 1 else 0
            model_asked = model_asked or _asks_the_model(q, dialect)
        check_size_floor(dialect, len(state_text), prompts, fixed, limits)
        if model_asked:
            check_model_floor(dialect, len(state_text), bound())

    return check


def _too_many_questions(dialect: Dialect, n: int, limits: Limits) -> RequestError:
    if dialect == "basal":
        return native_refusal(f"{n} questions; a request may ask at most {limits.max_questions}")
    return systemone_invalid(f"Too many questions. Must have at most {limits.max_questions} questions.")


def parse_systemone(
    raw: Any,
    resolve_model: Callable[[str], str | None],
    limits: Limits = DEFAULT_LIMITS,
    serves_evidence: Callable[[str], bool] = lambda _model: False,
    prompt_bound: PromptBound = _no_bound,
) -> DecisionRequest:
    """Validate a decoded ``/v1/systemone`` body and plan its questions.

    `resolve_model` maps a requested model name (or alias) to the served name, or None if not served;
    `serves_evidence(name)`: that model has an evidence head (else `evidence` is refused as unsupported);
    `prompt_bound(name)`: that model's (prompt characters, context tokens), checked against the state before
    facts run.
    Order of checks as on the hosted API: body shape (422, all errors), then model and limits (400, first),
    then what basal does not support yet (422 unsupported).
    """
    errors = _ShapeErrors(limits)
    if not isinstance(raw, dict):
        errors.add("dict_type", [], "Input should be a valid dictionary", raw)
        raise errors.refusal()
    if isinstance(raw.get("questions"), dict) and len(raw["questions"]) > limits.max_questions:
        raise _too_many_questions("systemone", len(raw["questions"]), limits)  # before any per-question work
    for key in ("model", "state", "questions"):
        if key not in raw:
            errors.missing([key], _misspelled_as(key, raw))
    if "model" in raw and not isinstance(raw["model"], str):
        errors.add("string_type", ["model"], "Input should be a valid string", raw["model"])
    state_ok = "state" in raw and errors.entry(raw["state"], ["state"], nullable=False)
    questions = raw.get("questions")
    if "questions" in raw:
        if not isinstance(questions, dict):
            errors.add("dict_type", ["questions"], "Input should be a valid dictionary", questions)
        elif not questions:
            errors.add(
                "too_short",
                ["questions"],
                "Dictionary should have at least 1 item after validation",
                questions,
                field_type="Dictionary",
                min_length=1,
                actual_length=0,
            )

    def bound() -> tuple[int, int] | None:
        requested = raw.get("model")
        served = resolve_model(requested) if isinstance(requested, str) else None
        return None if served is None else prompt_bound(served)

    sized = _size_check("systemone", questions, limits, bound)
    state_text = systemone_state_text(raw, state_ok, errors, sized)  # facts: "off" / "auto"
    if isinstance(questions, dict):
        ext.check_multi_evidence(questions, errors)
        for qid, q in questions.items():
            if errors.full:
                errors.stopped = True
                break
            _check_question_shape(qid, q, errors)
    if errors.items:
        raise errors.refusal()

    model = resolve_model(raw["model"])
    if model is None:
        raise systemone_usage(f"Unknown model: {echo(raw['model'], limits)}{_served_hint(resolve_model)}")
    unsupported = ErrorList(limits.max_errors, limits.max_echo_chars)
    planned = []
    has_head = serves_evidence(model)
    for qid, q in questions.items():
        question = _plan_systemone(qid, q, state_text, unsupported, has_head)
        if question is not None:
            planned.append(question)
    if unsupported:
        raise unsupported.unsupported()
    return DecisionRequest("systemone", model, tuple(planned), facts_limit=_facts_limit(raw))


def _facts_limit(raw: dict[str, Any]) -> int | None:
    """With facts "auto": the length of the state before the facts block (evidence spans are clipped to it)."""
    return len(text_of(raw["state"])) if raw.get("facts") == "auto" else None


_COMMON_KEYS = frozenset({"type", "instructions", "criteria", "evidence"})
_ALLOWED_KEYS = {
    "noul": _COMMON_KEYS,
    "choice": _COMMON_KEYS | {"option_keys"},
    "score": _COMMON_KEYS,
    "multi": ext.MULTI_KEYS,
    "act": ext.ACT_KEYS,
}


def _check_question_shape(qid: str, q: Any, errors: _ShapeErrors) -> None:
    if not isinstance(q, dict):
        errors.add("model_attributes_type", ["questions", qid], "Input should be a valid dictionary", q)
        return
    qtype = q.get("type")
    if "type" not in q:
        errors.missing(["questions", qid, "type"])
        return
    if not isinstance(qtype, str):
        errors.add("string_type", ["questions", qid, "type"], "Input should be a valid string", qtype)
        return
    if qtype not in _ALLOWED_KEYS:
        return  # an unknown type is a 400 (checked with the limits); extensions are 422 unsupported
    loc = ["questions", qid, qtype]
    for key in q:
        if key not in _ALLOWED_KEYS[qtype]:
            errors.extra([*loc, key], q[key], _ALLOWED_KEYS[qtype])
    if "instructions" in q:
        errors.entry(q["instructions"], [*loc, "instructions"], nullable=True)
    criteria = q.get("criteria")
    if qtype == "multi":
        ext.check_multi_shape(qid, q, errors, errors.entry)
    elif qtype == "act":
        ext.check_act_shape(qid, q, errors, errors.entry)
    elif qtype == "noul":
        if criteria is None:
            return
        if not isinstance(criteria, dict):
            errors.add("dict_type", [*loc, "criteria"], "Input should be a valid dictionary", criteria)
            return
        for side, value in criteria.items():
            if side in ("true", "false"):
                errors.entry(value, [*loc, "criteria", side], nullable=True)
            else:
                errors.extra([*loc, "criteria", side], value, ("true", "false"))
    elif qtype == "choice":
        if "option_keys" in q and q["option_keys"] not in ("show", "hide"):
            errors.add(
                "literal_error",
                [*loc, "option_keys"],
                "Input should be 'show' or 'hide'",
                q["option_keys"],
                expected="'show' or 'hide'",
            )
        if "criteria" not in q:
            errors.missing([*loc, "criteria"])
        elif not isinstance(criteria, dict):
            errors.add("dict_type", [*loc, "criteria"], "Input should be a valid dictionary", criteria)
        else:
            for key, value in criteria.items():
                errors.entry(value, [*loc, "criteria", key], nullable=True)
    else:  # score
        if "criteria" not in q:
            errors.missing([*loc, "criteria"])
        elif not isinstance(criteria, list):
            errors.add("list_type", [*loc, "criteria"], "Input should be a valid list", criteria)
        elif not criteria:
            errors.add(
                "too_short",
                [*loc, "criteria"],
                "List should have at least 1 item after validation",
                criteria,
                field_type="List",
                min_length=1,
                actual_length=0,
            )
        else:
            for i, value in enumerate(criteria):
                errors.entry(value, [*loc, "criteria", i], nullable=False)


def _plan_systemone(
    qid: str, q: dict[str, Any], state_text: str, unsupported: ErrorList, has_head: bool = False
) -> Question | None:
    """One shape-checked question -> its plan; 400 for semantic limits; unsupported features are collected."""
    qtype = q["type"]
    if qtype == "box":
        unsupported.add("unsupported", ["questions", qid, "type"], '"box" questions need a vision model')
        return None
    if qtype not in _ALLOWED_KEYS:
        raise systemone_usage(
            f"Invalid request: question {echo(qid)!r} has unknown type {echo(qtype)!r}; "
            f"allowed types: {', '.join(_ALLOWED_KEYS)}."
        )
    instructions = q.get("instructions")
    question_text = "" if instructions is None else text_of(instructions)
    evidence = qtype != "multi" and ext.truthy(q.get("evidence"))
    if evidence and not has_head:
        ext.evidence_unsupported(qid, unsupported)
    elif evidence and not ext.evidence_option_count_ok(q):
        ext.evidence_unsupported(qid, unsupported, ext.EVIDENCE_OPTIONS)
    if qtype == "multi":
        planned = ext.plan_multi_systemone(qid, q, state_text, question_text, unsupported)
        return None if planned is None else _from_planned(planned, False)
    if qtype == "act":
        planned = ext.plan_act_systemone(qid, q, state_text, question_text, unsupported)
        return None if planned is None else _from_planned(planned, evidence)
    lang = _lang(state_text, question_text)
    criteria = q.get("criteria")
    legend: tuple[Any, ...] = ()
    if qtype == "noul":
        sides = criteria or {}
        if instructions is None and sides.get("true") is None and sides.get("false") is None:
            raise systemone_invalid(f"Noul question must have instructions or criteria: {echo(qid)}")
        yes, no = DEFAULT_YES_NO[lang]
        keys = ["true", "false"]
        options = [
            text_of(yes if sides.get("true") is None else sides["true"]),
            text_of(no if sides.get("false") is None else sides["false"]),
        ]
    elif qtype == "choice":
        if not criteria:
            raise systemone_invalid(f"Choice question must have at least one choice: {echo(qid)}")
        if len(criteria) > MAX_CHOICES:
            raise systemone_invalid(f"Too many choices. Must have at most {MAX_CHOICES} choices.")
        keys, options = named_options(criteria, q.get("option_keys", "show"))
    else:
        if len(criteria) > MAX_LEVELS:
            raise systemone_invalid(f"Too many score levels. Must have at most {MAX_LEVELS} levels.")
        keys = [str(i) for i in range(len(criteria))]
        options = [text_of(level) for level in criteria]
        legend = tuple(criteria)
    item = Item(qid, qtype, tuple(keys), tuple(options), lang, state_text, question_text)
    return Question(qtype, item, legend, evidence=evidence)


# ---------------------------------------------------------------------------------------------------------------
# /v1/basal — the upstream basal-serve dialect (lenient; upstream messages where upstream has them)


BASAL_BODY_KEYS = frozenset({"model", "state", "questions", "facts", "lang"})
# Fields of the native SDK (basal-client) that change a question's meaning and that basal does not do: refused,
# never ignored with a warning (an answer computed without them would look right and mean something else).
BASAL_REFUSED_BODY_KEYS = {
    "media": "media inputs (images, documents) are not supported: basal models read text only",
    "detail": "media detail is not supported: basal models read text only",
    "stream": "streaming answers are not supported: a decision is one JSON answer",
}
BASAL_REFUSED_TYPES = {
    "tool": "tool questions are not supported",
    **{t: f"{t} tasks are not supported" for t in ("classify", "verify", "compress", "extract")},
}
BASAL_REFUSED_MULTI_KEYS = ("exclusive", "fallback", "fallback_threshold")
_BASAL_COMMON = frozenset({"type", "instructions", "criteria", "evidence"})
BASAL_QUESTION_KEYS = {  # the fields upstream reads, by question type (an unknown type is read as a choice)
    "choice": _BASAL_COMMON | {"option_keys"},
    "noul": _BASAL_COMMON,
    "score": _BASAL_COMMON | {"levels", "option_keys"},
    "multi": ext.MULTI_KEYS,
    "act": ext.ACT_KEYS,
}


def parse_basal(
    raw: Any,
    resolve_model: Callable[[str | None], str | None],
    check_evidence: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    serves_evidence: Callable[[str], bool] = lambda _model: False,
    prompt_bound: PromptBound = _no_bound,
) -> DecisionRequest:
    """Validate a decoded ``/v1/basal`` body like upstream ``to_items``; `resolve_model(None)` = default model.

    `check_evidence=False` plans questions that ask for evidence as if they did not (check-reference);
    `serves_evidence(name)`: that model has an evidence head; `prompt_bound` as for `parse_systemone`."""
    if not isinstance(raw, dict):
        raise native_refusal("the request body must be a JSON object", "TypeError")
    for key, why in BASAL_REFUSED_BODY_KEYS.items():
        if raw.get(key) not in (None, False):  # "stream": false asks for what basal does
            raise native_refusal(f'"{key}": {why}')
    forced_lang = raw.get("lang")
    if forced_lang not in (None, "pl", "en"):
        raise native_refusal(
            f'"lang" must be "pl" or "en" (or absent: detected from the text), got {echo(repr(forced_lang))}'
        )
    warnings = Warnings()
    warnings.ignored(raw, BASAL_BODY_KEYS | BASAL_REFUSED_BODY_KEYS.keys())  # those left are null / false
    for key in ("state", "questions"):
        if key not in raw:
            raise native_refusal(f'the request has no "{key}"', "KeyError")
    requested = raw.get("model")
    if requested is not None and not isinstance(requested, str):
        raise native_refusal('"model" must be a string', "TypeError")
    model = resolve_model(requested)
    if model is None:
        shown = f"unknown model: {echo(requested, limits)}"
        raise native_refusal(shown + _served_hint(resolve_model), upstream=shown)
    questions = raw["questions"]
    if not isinstance(questions, dict):
        raise native_refusal('"questions" must be an object of questions by name', "AttributeError")
    if len(questions) > limits.max_questions:
        raise _too_many_questions("basal", len(questions), limits)
    if depth_of(raw["state"]) > MAX_DEPTH:
        raise native_refusal(f"state is nested deeper than {MAX_DEPTH} levels")
    sized = _size_check("basal", questions, limits, lambda: prompt_bound(model))
    state_text = basal_state_text(raw, sized)  # facts: "off" / "auto"
    planned = tuple(_plan_basal(name, q, state_text, warnings, forced_lang) for name, q in questions.items())
    if check_evidence:
        _fail_before_the_run(planned, serves_evidence(model))
    else:
        planned = tuple(replace(q, evidence=False) for q in planned)
    return DecisionRequest("basal", model, planned, warnings.messages(), facts_limit=_facts_limit(raw))


def _fail_before_the_run(questions: tuple[Question, ...], has_head: bool = False) -> None:
    """Raise now what upstream would raise after the run, when no earlier question could fail first.

    Upstream builds answers in question order (a multi's int(max), an act refusal without a defer action can
    fail there), then refuses evidence for want of a head, then evidence on a multi. Only an act with max_error
    and no defer action depends on the model's output; up to such a question, the outcome is known before
    anything runs (the pipeline raises the same errors after the run otherwise).
    """
    for q in questions:
        if q.deferred_error is not None:
            raise q.deferred_error
        if ext.may_fail_after_run(q.spec):
            return
    if any(q.evidence for q in questions) and not has_head:
        raise ext.evidence_refusal_basal()
    for q in questions:
        if q.evidence and q.branches:
            raise ext.multi_evidence_error_basal(q.name)


def _plan_basal(name: str, q: Any, state_text: str, warnings: Warnings, forced_lang: str | None = None) -> Question:
    """One question; `forced_lang`: the request's ``lang`` in place of language detection."""
    shown = echo(name)  # the name as quoted in errors
    if not isinstance(q, dict):
        raise native_refusal(f"question {shown!r} must be an object", "AttributeError")
    qtype = q.get("type", "choice")
    if not isinstance(qtype, str):
        raise native_refusal(f"question {shown!r}: type must be a string", "TypeError")
    _refuse_unserved(shown, qtype, q)
    warnings.ignored(q, BASAL_QUESTION_KEYS.get(qtype, BASAL_QUESTION_KEYS["choice"]), name)
    if any(depth_of(v) > MAX_DEPTH for v in q.values()):
        raise native_refusal(f"question {shown!r} is nested deeper than {MAX_DEPTH} levels")
    question_text = text_of(q.get("instructions", ""))
    evidence = ext.truthy(q.get("evidence"))
    if qtype == "multi":
        return _from_planned(ext.plan_multi_basal(name, q, state_text, question_text, forced_lang), evidence)
    if qtype == "act":
        option_keys = lambda: _basal_option_keys(q)  # noqa: E731 (read only where the readout shows keys)
        planned = ext.plan_act_basal(name, q, state_text, question_text, option_keys, forced_lang)
        return _from_planned(planned, evidence)
    lang = forced_lang or _lang(state_text, question_text)
    kind: Kind
    if qtype == "noul":  # upstream falls back to the default text for any falsy side ("", {}, [], null)
        kind = "noul"
        sides = q.get("criteria") or {}
        if not isinstance(sides, dict):
            raise native_refusal(f"question {shown!r}: noul criteria must be an object", "AttributeError")
        yes, no = DEFAULT_YES_NO[lang]
        keys, options = ["true", "false"], [text_of(sides.get("true") or yes), text_of(sides.get("false") or no)]
    elif qtype == "score":
        kind = "score"
        levels = q.get("criteria") or q.get("levels") or []
        _check_option_count(shown, levels, qtype)
        if isinstance(levels, dict):
            keys, options = named_options(levels, _basal_option_keys(q))
        elif isinstance(levels, list):
            keys, options = [str(i) for i in range(len(levels))], [text_of(v) for v in levels]
        else:
            raise native_refusal(f"question {shown!r}: score criteria must be a list or an object", "TypeError")
    else:  # choice; an unknown type name is asked as a choice and gets no temperature (T = 1)
        kind = "choice"
        criteria = q.get("criteria") or {}
        if isinstance(criteria, list):
            if not all(isinstance(k, str) for k in criteria):
                raise native_refusal(
                    f"question {shown!r}: a criteria list must hold option names (strings)", "TypeError"
                )
            criteria = dict.fromkeys(criteria)
        if not isinstance(criteria, dict):
            raise native_refusal(f"question {shown!r}: choice criteria must be an object or a list", "TypeError")
        _check_option_count(shown, criteria, qtype)
        keys, options = named_options(criteria, _basal_option_keys(q))
    if not 2 <= len(options) <= MAX_OPTIONS:
        raise _option_count_error(shown, len(options), qtype, q)
    if qtype not in BASAL_QUESTION_KEYS:
        warnings.add(f"question {shown!r}: {_unknown_type(qtype)}")
    item = Item(name, qtype, tuple(keys), tuple(options), lang, state_text, question_text)
    return Question(kind, item, tuple(options) if kind == "score" else (), evidence=evidence)


def _refuse_unserved(shown: str, qtype: str, q: dict[str, Any]) -> None:
    """The native SDK's question types and multi options that basal does not do: 422, not a silent choice."""
    if qtype in BASAL_REFUSED_TYPES:
        raise native_refusal(
            f"question {shown!r}: {BASAL_REFUSED_TYPES[qtype]} (basal answers {', '.join(BASAL_QUESTION_KEYS)})"
        )
    if qtype != "multi":
        return
    objective = q.get("objective")
    if objective not in (None, "threshold"):
        raise native_refusal(
            f'question {shown!r}: multi objective {echo(repr(objective))} is not supported (only "threshold")'
        )
    for key in BASAL_REFUSED_MULTI_KEYS:
        if q.get(key) is not None:
            raise native_refusal(f"question {shown!r}: multi {key!r} is not supported")


def _check_option_count(shown: str, criteria: Any, qtype: str) -> None:
    """The option limit, checked before any option is rendered (a request may send thousands)."""
    if isinstance(criteria, dict | list) and len(criteria) > MAX_OPTIONS:
        raise _option_count_error(shown, len(criteria), qtype)


def _option_count_error(shown: str, n: int, qtype: str, q: dict[str, Any] | None = None) -> RequestError:
    """Upstream's message, and why where basal can tell: an unknown type was asked as a choice, a misspelled
    field (``critera``) left the question without options."""
    message = f"question {shown!r}: {n} options (supported: 2..{MAX_OPTIONS})"
    hints = [] if qtype in BASAL_QUESTION_KEYS else [_unknown_type(qtype)]
    allowed = BASAL_QUESTION_KEYS.get(qtype, BASAL_QUESTION_KEYS["choice"])
    for key in itertools.islice(q or {}, MAX_KEYS_COMPARED) if n < 2 else ():
        if key not in allowed and (match := nearest(key, allowed)):
            hints.append(f"ignored field {echo(key[:MAX_KEY_CHARS])!r} (did you mean {match!r}?)")
            break
    return native_refusal("; ".join([message, *hints]), upstream=message)


def _unknown_type(qtype: str) -> str:
    return f"type {echo(qtype)!r} is not one of {', '.join(BASAL_QUESTION_KEYS)}, so it was asked as a choice"


def _basal_option_keys(q: dict[str, Any]) -> str:
    option_keys = q.get("option_keys", "show")
    if option_keys not in ("show", "hide"):
        raise native_refusal(f'option_keys must be "show" or "hide", got {echo(repr(option_keys))}')
    return option_keys
