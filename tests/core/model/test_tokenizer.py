"""Tokenizer semantics on the synthetic Bielik-style tokenizer."""

from __future__ import annotations

import json

import pytest

from basal.core.errors import ModelDirError
from basal.core.model.prompt import LETTERS, render_prompt, template_prefix
from basal.core.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(demo_dir) -> Tokenizer:
    return Tokenizer(demo_dir / "tokenizer.json")


def _variant(demo_dir, tmp_path, **changes) -> Tokenizer:
    spec = json.loads((demo_dir / "tokenizer.json").read_text())
    for key, value in changes.items():
        spec[key] = value
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return Tokenizer(path)


def test_special_tokens_in_text_are_matched_and_none_added(tok):
    ids = tok.encode("<s><|im_start|>user\nx<|im_end|>")
    assert ids[:2] == [tok._tk.token_to_id("<s>"), tok._tk.token_to_id("<|im_start|>")]
    assert ids[-1] == tok._tk.token_to_id("<|im_end|>")
    assert tok.encode("x") == tok.encode("x")[:]  # no BOS/EOS added around plain text
    assert tok._tk.token_to_id("<s>") not in tok.encode("x")


def test_letters_are_distinct_single_tokens_for_every_prompt(tok):
    assert len(set(tok.letter_ids(10))) == 10
    for k in range(2, 11):
        for lang, state in (("pl", "Zażółć gęślą jaźń"), ("en", '{"A": "B"}'), ("en", "")):
            prompt = render_prompt(state, "Which?", [f"opt {i}" for i in range(k)], lang)
            assert tok.discover_letters(prompt, k) == tok.letter_ids(k)


def test_a_tokenizer_that_merges_a_letter_into_the_prefill_is_refused(demo_dir, tmp_path):
    spec = json.loads((demo_dir / "tokenizer.json").read_text())
    model = spec["model"]
    model["vocab"]['"C'] = max(model["vocab"].values()) + 1
    pair = ['"', "C"] if isinstance(model["merges"][0], list) else '" C'
    model["merges"].insert(0, pair)  # highest priority: '"' + 'C' -> '"C'
    with pytest.raises(ModelDirError, match="letters"):
        _variant(demo_dir, tmp_path, model=model)


def test_template_prefix_length_is_a_true_prefix(tok):
    for lang in ("pl", "en"):
        n = tok.prefix_len[lang]
        assert n > 10
        a = tok.encode(render_prompt("pierwszy stan", "q", ["a", "b"], lang))
        b = tok.encode(render_prompt('{"x": [1, 2]}', "q", ["a", "b"], lang))
        assert a[:n] == b[:n] == tok.encode(template_prefix(lang))[:n]


def test_prepend_scheme_is_forced_to_first(demo_dir, tmp_path, tok):
    pre = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}
    always = _variant(demo_dir, tmp_path, pre_tokenizer=pre)
    text = render_prompt("Order 42", "Late?", ["Yes", "No"], "en")
    assert always.encode(text) == tok.encode(text)


def test_truncation_and_padding_in_the_file_are_disabled(demo_dir, tmp_path, tok):
    truncated = _variant(
        demo_dir,
        tmp_path,
        truncation={"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0},
        padding={
            "strategy": {"Fixed": 512},
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": "<unk>",
        },
    )
    text = render_prompt("długi stan " * 50, "q", ["a", "b"], "pl")
    assert truncated.encode(text) == tok.encode(text) and len(tok.encode(text)) > 100


@pytest.mark.parametrize(
    "change",
    [
        {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}},
        {"normalizer": {"type": "NFC"}},
    ],
)
def test_other_tokenizers_are_refused(demo_dir, tmp_path, change):
    with pytest.raises(ModelDirError):
        _variant(demo_dir, tmp_path, **change)


def test_letters_constant_matches_contract():
    assert LETTERS == "ABCDEFGHIJ"
