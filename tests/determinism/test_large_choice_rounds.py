"""A choice with 11–255 options runs in rounds (groups, then the final 10): every round's letter logits are bitwise
identical asked alone, in a tree with questions on the same state, and batched with other requests' questions —
so its finalists and its joint distribution are too. The negative control shows the comparison can fail."""

from __future__ import annotations

import random

import pytest

from basal.core.decision.large_choice import LargeChoice
from basal.core.model.prompt import Item
from tests.determinism.harness import WORDS, Harness, available, same_bits

N_OPTIONS = 12  # 4 groups of 6, then the final 10


def _large_item(rng: random.Random, lang: str, n: int = N_OPTIONS) -> Item:
    words = WORDS[lang]
    state = " ".join(rng.choice(words) for _ in range(12))
    options = tuple(f"{rng.choice(words)} {i}" for i in range(n))
    keys = tuple(f"o{i}" for i in range(n))
    return Item("q", "choice", keys, options, lang, state, "Which one?")


def _rounds(h: Harness, item: Item, company):
    """Group logits and final-round logits of `item`, with `company` (tokenized questions) around each round."""
    lc = LargeChoice(item)
    groups = h.cached.tokenize_items(lc.first_round())
    half = len(company) // 2
    together = h.logits([*company[:half], *groups, *company[half:]])
    group_logits = together[half : half + len(groups)]
    final = h.cached.tokenize_items([lc.final_round(group_logits)])
    final_logits = h.logits([*company, *final])[-1]
    return lc, group_logits, final_logits


def _company(h: Harness, rng: random.Random, item: Item):
    same_state = h.question(rng, item.lang, state=item.state_text, k=3)
    strangers = [h.question(rng, lang, state_words=8, k=2) for lang in ("pl", "en")]
    return [strangers[0], same_state, strangers[1]]


def test_large_choice_rounds_alone_and_in_company(harness):
    rng = random.Random(3)
    item = _large_item(rng, rng.choice(["pl", "en"]))
    alone, alone_groups, alone_final = _rounds(harness, item, [])
    mixed, mixed_groups, mixed_final = _rounds(harness, item, _company(harness, rng, item))
    assert all(same_bits(a, b) for a, b in zip(alone_groups, mixed_groups, strict=True))
    assert alone.finalists == mixed.finalists and same_bits(alone_final, mixed_final)
    assert alone.finish(alone_final).tobytes() == mixed.finish(mixed_final).tobytes()


@pytest.mark.parametrize(
    "combo", [c for c in available() if c[0] == "torch" and c[2] == "f32"][:1], ids=lambda c: "-".join(c)
)
def test_negative_control_sees_a_difference_in_the_rounds(demo_model, combo):
    """With shape-dependent kernels the same comparison of group logits must fail somewhere."""
    h = Harness(demo_model, *combo, fixed_shapes=False)
    rng = random.Random(3)
    item = _large_item(rng, "en", 23)  # 6 groups: enough rows for the shape-dependent GEMMs to round differently
    _, alone_groups, _ = _rounds(h, item, [])
    _, mixed_groups, _ = _rounds(h, item, _company(h, rng, item))
    differences = sum(not same_bits(a, b) for a, b in zip(alone_groups, mixed_groups, strict=True))
    assert differences > 0
