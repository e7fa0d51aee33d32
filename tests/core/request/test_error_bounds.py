"""Error bodies stay small however malformed or large the request: every error path of both dialects goes through
one bounded collector (`basal.core.errors.ErrorList`), and a refusal quotes at most a few hundred characters of
the request. Also: numbers that are not finite are refused with the dialect's 422."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basal.core.errors import RequestError
from basal.core.request.dialects import parse_basal, parse_systemone
from basal.core.request.limits import Limits

LIMITS = Limits(max_errors=4, max_echo_chars=16)
# Every string of an entry is cut to 16 characters (messages to MAX_MESSAGE_CHARS), at most 4 entries and the
# "more not listed" one; JSON escapes a character into at most 6 bytes.
MESSAGE_CHARS = 1000  # basal.core.errors.MAX_MESSAGE_CHARS (not imported: the test runs against older code too)
ENTRY_BYTES = 6 * (MESSAGE_CHARS + 12 * (LIMITS.max_echo_chars + 1)) + 200
BODY_BYTES = (LIMITS.max_errors + 1) * ENTRY_BYTES


def refusal(raw, dialect: str, limits: Limits = LIMITS) -> RequestError:
    with pytest.raises(RequestError) as info:
        if dialect == "systemone":
            parse_systemone(raw, lambda m: m if m == "demo" else None, limits=limits)
        else:
            parse_basal(raw, lambda m: "demo" if m in (None, "demo") else None, limits=limits)
    return info.value


def body_size(e: RequestError) -> int:
    return len(msgspec.json.encode(e.body))


def act_with_long_outcomes(rows: int) -> dict:
    """The probe's request: 10 outcomes with 10,000-character names, `rows` cost rows that miss an outcome."""
    outcomes = [f"{i}" * 10_000 for i in range(10)]
    costs = {f"a{r}": {z: 1 for z in outcomes[:-1]} for r in range(rows)}
    return {"model": "demo", "state": "s", "questions": {"q": {"type": "act", "criteria": outcomes, "costs": costs}}}


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_act_cost_errors_do_not_repeat_every_outcome(dialect):
    raw = act_with_long_outcomes(200)
    e = refusal(raw, dialect, Limits())
    assert e.status == 422
    assert body_size(e) < 100_000  # was 20 MB for 200 rows (each error listed every outcome in full)
    if dialect == "systemone":
        assert len(e.body["detail"]) == Limits().max_errors + 1 and e.body["detail"][-1]["type"] == "too_many_errors"


def test_malformed_multi_labels_are_listed_up_to_max_errors():
    raw = {"model": "demo", "state": "s", "questions": {"q": {"type": "multi", "criteria": list(range(50_000))}}}
    e = refusal(raw, "systemone")
    assert len(e.body["detail"]) == LIMITS.max_errors + 1
    assert body_size(e) <= BODY_BYTES


@pytest.mark.parametrize("dialect", ["systemone", "basal"])
def test_a_long_question_name_is_echoed_cut(dialect):
    name = "n" * (1 << 20)
    raw = {"model": "demo", "state": "s", "questions": {name: {"type": "act", "criteria": ["a", "b"], "costs": {}}}}
    e = refusal(raw, dialect)
    assert body_size(e) < 8_000  # the 1 MB name was echoed whole, twice


def test_unsupported_entries_are_bounded():
    questions = {f"{i}" * 300: {"type": "box"} for i in range(10)}
    e = refusal({"model": "demo", "state": "s", "questions": questions}, "systemone")
    assert e.body["error"] == "unsupported" and len(e.body["detail"]) == LIMITS.max_errors + 1
    assert all(len(part) <= LIMITS.max_echo_chars + 1 for entry in e.body["detail"] for part in entry["loc"][1:])


# ---------------------------------------------------------------------------------------------------------------
# Property: whatever a malformed request holds, its error body is at most BODY_BYTES.

big_text = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=3), st.integers(1, 20_000))
scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), big_text)
value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(big_text, inner, max_size=5))
many = st.builds(lambda v, n: [v] * n, scalar, st.integers(0, 3000))
cost_rows = st.dictionaries(big_text, st.one_of(value, st.dictionaries(big_text, scalar, max_size=12)), max_size=40)
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["act", "multi", "choice", "noul", "score", "box", "other"])},
    optional={
        "criteria": st.one_of(value, many, st.dictionaries(big_text, value, max_size=12)),
        "costs": st.one_of(value, cost_rows),
        "threshold": value,
        "max": value,
        "min": value,
        "base": value,
        "option_keys": value,
        "defer_action": value,
        "max_error": value,
        "evidence": value,
        "instructions": value,
        "typo": value,
    },
)
body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("demo"), value),
        "state": value,
        "facts": value,
        "questions": st.one_of(value, st.dictionaries(big_text, question, max_size=8)),
        "extra": value,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=body, dialect=st.sampled_from(["systemone", "basal"]))
def test_error_bodies_are_bounded_by_a_constant(raw, dialect):
    try:
        if dialect == "systemone":
            parse_systemone(raw, lambda m: m if m == "demo" else None, limits=LIMITS)
        else:
            parse_basal(raw, lambda m: "demo" if m in (None, "demo") else None, limits=LIMITS)
    except RequestError as e:
        assert body_size(e) <= BODY_BYTES
        if isinstance(e.body.get("detail"), list):
            assert len(e.body["detail"]) <= LIMITS.max_errors + 1


# ---------------------------------------------------------------------------------------------------------------
# Numbers that are not numbers


def act(costs, **fields) -> dict:
    q = {"type": "act", "criteria": ["a", "b"], "costs": costs, **fields}
    return {"model": "demo", "state": "s", "questions": {"q": q}}


NOT_FINITE = ["nan", "inf", "-inf", "NaN", "Infinity", "1" * 5000, "-" + "9" * 400]


@pytest.mark.parametrize("text", NOT_FINITE)
@pytest.mark.parametrize(
    "make",
    [
        lambda x: act({"wrong": x}),
        lambda x: act({"wrong": 1, "defer": x}),
        lambda x: act({"a": {"a": 0, "b": x}, "b": {"a": 1, "b": 0}}),
        lambda x: {"state": "s", "questions": {"q": {"type": "multi", "criteria": ["a", "b"], "threshold": x}}},
    ],
    ids=["wrong", "defer", "matrix", "threshold"],
)
def test_basal_refuses_numbers_that_are_not_finite(make, text):
    e = refusal(make(text), "basal")
    assert e.status == 422 and "finite number" in e.body["error"]
    assert len(e.body["error"]) < 300


def test_systemone_refuses_numbers_that_are_not_finite():
    for raw in (act({"wrong": float("inf")}), act({"wrong": 1.0, "defer": float("nan")})):
        e = refusal(raw, "systemone")
        assert e.status == 422 and e.body["detail"][0]["type"] == "float_type"


def test_finite_strings_are_still_read_as_upstream_reads_them():
    parse_basal(act({"wrong": "2.5", "defer": "1e3"}), lambda m: "demo")
