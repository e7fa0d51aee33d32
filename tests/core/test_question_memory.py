"""Memory per question: many questions on one long state cost a few bytes per prompt token once tokenized (shared
int objects in tuples), and the tokenizer's own per-token structures are built a bounded batch at a time."""

from __future__ import annotations

import tracemalloc

from basal.core.model import tokenizer as tokenizer_module
from basal.core.request.dialects import parse_systemone

STATE = "Customer wrote: the parcel arrived damaged and I want a refund. " * 100  # ~6.5 KB, as the probe's


def prompts_of(model, questions: int) -> list[str]:
    raw = {
        "model": "m",
        "state": STATE,
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Case {i}?"} for i in range(questions)},
    }
    items = [q.item for q in parse_systemone(raw, lambda m: m).questions]
    return [item.prompt(order, model.bos) for item in items for order in item.orders]


def pipeline_and_items(model, questions: int, monkeypatch):
    """A torch pipeline of `model` and the items of `questions` noul questions on STATE, encoded 64 KB at a time
    (the pipeline warmed up)."""
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.pipeline import Pipeline

    raw = {
        "model": "m",
        "state": STATE,
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Case {i}?"} for i in range(questions)},
    }
    items = [q.item for q in parse_systemone(raw, lambda m: m).questions]
    pipeline = Pipeline(model, TorchBackend.load(model))
    monkeypatch.setattr(tokenizer_module, "ENCODE_CHARS", 64_000)
    pipeline.tokenize_items(items[:2])  # warm up
    return pipeline, items


def test_tokenized_prompts_cost_a_few_bytes_per_token(demo_model):
    prompts = prompts_of(demo_model, 128)
    tokenizer = demo_model.tokenizer
    tokenizer.encode_batch(prompts[:2])  # warm up whatever the tokenizer builds once
    tracemalloc.start()
    try:
        ids = tokenizer.encode_batch(prompts)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tokens = sum(map(len, ids))
    assert tokens > 256 * 1000
    assert held / tokens < 12  # 8 bytes a token in its tuple; lists of fresh ints held ~36


def test_long_batches_are_encoded_in_bounded_pieces(demo_model, monkeypatch):
    prompts = prompts_of(demo_model, 64)
    whole = demo_model.tokenizer.encode_batch(prompts)
    seen = []
    inner = demo_model.tokenizer._tk
    real = inner.encode_batch

    class Counting:
        def __getattr__(self, name):
            return getattr(inner, name)

        def encode_batch(self, texts, **kwargs):
            seen.append(sum(map(len, texts)))
            return real(texts, **kwargs)

    monkeypatch.setattr(tokenizer_module, "ENCODE_CHARS", 100_000, raising=False)
    monkeypatch.setattr(demo_model.tokenizer, "_tk", Counting())
    assert demo_model.tokenizer.encode_batch(prompts) == whole  # the same ids, however they are batched
    assert len(seen) > 1 and max(seen) <= 100_000


def test_prompt_texts_are_built_as_they_are_encoded(demo_model, monkeypatch):
    """The pipeline hands the tokenizer its prompts as they are built: with 64 KB batches, the texts of 128
    questions on a 6.5 KB state (1.7 MB) are never all alive at once, and the ids are those of a plain list."""
    whole = demo_model.tokenizer.encode_batch(prompts_of(demo_model, 128))
    pipeline, items = pipeline_and_items(demo_model, 128, monkeypatch)
    tracemalloc.start()
    try:
        tokenized = pipeline.tokenize_items(items)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [p for t in tokenized for p in t.prompts] == whole
    tuples = 8 * sum(map(len, whole))
    texts = sum(map(len, prompts_of(demo_model, 128)))
    assert peak < tuples + texts / 4, (peak, tuples, texts)
