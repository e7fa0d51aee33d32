"""Shared by the memory-per-question tests: many noul questions on one ~6.5 KB state, a warmed-up pipeline for
them, and the Python memory a call allocates (tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

from basal.core.model import tokenizer as tokenizer_module
from basal.core.request.dialects import parse_systemone

STATE = "Customer wrote: the parcel arrived damaged and I want a refund. " * 100  # ~6.5 KB, as the probe's
T = TypeVar("T")


def items_of(questions: int) -> list:
    """The parsed items of `questions` noul questions on STATE."""
    raw = {
        "model": "m",
        "state": STATE,
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Case {i}?"} for i in range(questions)},
    }
    return [q.item for q in parse_systemone(raw, lambda m: m).questions]


def prompts_of(model, questions: int) -> list[str]:
    return [item.prompt(order, model.bos) for item in items_of(questions) for order in item.orders]


def pipeline_and_items(model, questions: int, monkeypatch):
    """A torch pipeline of `model` and the items of `questions` noul questions on STATE, encoded 64 KB at a time
    (the pipeline warmed up)."""
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline

    items = items_of(questions)
    pipeline = Pipeline(model, TorchBackend.load(model))
    monkeypatch.setattr(tokenizer_module, "ENCODE_CHARS", 64_000)
    pipeline.tokenize_items(items[:2])  # warm up
    return pipeline, items


def traced(fn: Callable[[], T]) -> tuple[T, int, int]:
    """`fn()`, and the bytes of Python allocations still held when it returns and at their peak while it ran."""
    tracemalloc.start()
    try:
        result = fn()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, held, peak
