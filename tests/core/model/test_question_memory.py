"""Memory per question: many questions on one long state cost a few bytes per prompt token once tokenized (shared
int objects in tuples), and the tokenizer's own per-token structures are built a bounded batch at a time."""

from __future__ import annotations

from basal.core.model import tokenizer as tokenizer_module
from tests.core.many_questions import pipeline_and_items, prompts_of, traced


def test_tokenized_prompts_cost_a_few_bytes_per_token(demo_model):
    prompts = prompts_of(demo_model, 128)
    tokenizer = demo_model.tokenizer
    tokenizer.encode_batch(prompts[:2])  # warm up whatever the tokenizer builds once
    ids, held, _ = traced(lambda: tokenizer.encode_batch(prompts))
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
    tokenized, _, peak = traced(lambda: pipeline.tokenize_items(items))
    assert [p for t in tokenized for p in t.prompts] == whole
    tuples = 8 * sum(map(len, whole))
    texts = sum(map(len, prompts_of(demo_model, 128)))
    assert peak < tuples + texts / 4, (peak, tuples, texts)
