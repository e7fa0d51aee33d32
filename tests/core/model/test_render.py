"""Rendering of JSON values: identical to Python ``json.dumps(ensure_ascii=False)`` of ``json.loads``."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.model.render import depth_of, text_of
from basal.core.request.dialects import decode_body

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_render_matches_python_json(value):
    """Whatever the client's JSON text, basal (msgspec decode) renders what upstream (json.loads) rendered."""
    text = json.dumps(value, ensure_ascii=False)
    expected = json.dumps(json.loads(text), ensure_ascii=False)
    assert text_of(decode_body(text.encode(), "basal")) == (expected if not isinstance(value, str) else value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.integers(), min_size=2, max_size=8))
def test_key_order_is_kept(d):
    keys = list(d)[::-1]  # an order that is not insertion-sorted
    text = "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {d[k]}" for k in keys) + "}"
    assert list(msgspec.json.decode(text.encode())) == keys
    assert text_of(msgspec.json.decode(text.encode())) == text


def test_float_and_integer_literals():
    raw = b'{"a": -3e-7, "b": 129.99, "c": 1E2, "d": -0, "e": 12345678901234567890123, "f": 1.0}'
    assert text_of(decode_body(raw, "basal")) == (
        '{"a": -3e-07, "b": 129.99, "c": 100.0, "d": 0, "e": 12345678901234567890123, "f": 1.0}'
    )


def test_control_characters_and_unicode():
    assert text_of({"t": "a\tb\n\u0001 żółw 👩‍💻"}) == '{"t": "a\\tb\\n\\u0001 żółw 👩‍💻"}'
    assert text_of("strings stay as they are\n") == "strings stay as they are\n"


def test_depth_of():
    assert depth_of("x") == 0 and depth_of([]) == 1 and depth_of({"a": [[1]]}) == 3
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert depth_of(deep, limit=64) == 65  # stops early, no recursion
