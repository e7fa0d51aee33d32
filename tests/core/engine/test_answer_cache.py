"""The exact-answer cache on its own: bounds (entries, bytes), least recently used out first, time to live, keys."""

from __future__ import annotations

import pytest

from basal.core.engine.answer_cache import AnswerCache, Stored, model_identity, request_key, split_timing
from basal.core.model.model_dir import Calibration


def _answer(n: int = 10) -> Stored:
    return Stored(b"x" * n, b"}", b"", True, 5)


def test_least_recently_used_goes_first_when_entries_are_full():
    cache = AnswerCache(2, 1 << 20, 60)
    cache.put(b"a", _answer())
    cache.put(b"b", _answer())
    assert cache.get(b"a") is not None  # a is now the most recently used
    cache.put(b"c", _answer())
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    assert cache.counts.evictions == 1 and len(cache) == 2


def test_the_byte_budget_holds_and_is_counted_exactly():
    one = _answer(1000)
    cache = AnswerCache(100, 3 * one.size, 60)
    for i in range(10):
        cache.put(bytes([i]), one)
        assert cache.bytes <= 3 * one.size
    assert len(cache) == 3 and cache.bytes == 3 * one.size
    cache.put(b"huge", _answer(10 * one.size))  # larger than the whole budget: not kept, nothing pushed out
    assert cache.get(b"huge") is None and len(cache) == 3


def test_time_to_live():
    now = [0.0]
    cache = AnswerCache(10, 1 << 20, 5.0, clock=lambda: now[0])
    cache.put(b"k", _answer())
    now[0] = 4.9
    assert cache.get(b"k") is not None
    now[0] = 5.1
    assert cache.get(b"k") is None
    assert cache.counts.expirations == 1 and cache.bytes == 0


def test_timing_split_leaves_only_the_number_out():
    content = b'{"answers":{"q":{"legend":{"latency_ms":1}}},"usage":{"questions":1,"latency_ms":12.25}}'
    head, tail, timed = split_timing(content)
    assert timed and head + b"12.25" + tail == content  # the usage's field, not the legend's
    assert split_timing(b'{"usage":{"input_tokens":3}}') == (b'{"usage":{"input_tokens":3}}', b"", False)


def test_every_part_of_a_key_matters():
    compute = {"backend": "torch", "device": "cpu", "dtype": "f32"}
    identity = model_identity("m", "1.0", Calibration({"choice": 1.2}), compute)
    base = ("basal", "shared", identity, False, "identity", b"{}")
    key = request_key(*base)
    changed = [
        ("systemone", *base[1:]),
        (base[0], "scope-of-key-b", *base[2:]),
        (base[0], base[1], model_identity("m", "1.1", Calibration({"choice": 1.2}), compute), *base[3:]),
        (base[0], base[1], model_identity("m", "1.0", Calibration({"choice": 1.3}), compute), *base[3:]),
        (*base[:3], True, *base[4:]),
        (*base[:4], "gzip", base[5]),
        (*base[:5], b"{ }"),
    ]
    assert all(request_key(*c) != key for c in changed)
    assert model_identity("m", "1.0", Calibration({"choice": 1.2}), {"dtype": "f32"}) != model_identity(
        "m", "1.0", Calibration({"choice": 1.2}), {"dtype": "bf16"}
    )


def test_bounds_must_be_positive():
    with pytest.raises(ValueError):
        AnswerCache(0, 1, 1)
