"""The model's tokenizer with upstream semantics (docs/contract.md §1.6).

* ``add_special_tokens=False``: ``<s>``, ``<|im_start|>``, ``<|im_end|>`` written in the prompt text are matched
  as special tokens; nothing is added around the text.
* Metaspace ``prepend_scheme`` is forced to ``"first"`` (basal-1.0 files store ``"always"``, which transformers 5
  rebuilds as ``"first"``); only Metaspace with ``▁`` and ``split: false`` and no normalizer are accepted.
* Truncation and padding stored in ``tokenizer.json`` are disabled (basal-1.0's file truncates at 1536 tokens,
  which upstream never applied).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from basal.core.errors import ModelDirError
from basal.core.model.prompt import LETTERS, render_prompt, template_prefix


def load_tokenizer_json(path: Path) -> HFTokenizer:
    """Read ``tokenizer.json``, check the pre-tokenizer contract and apply the upstream fixes."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "Metaspace" or pre.get("replacement") != "▁" or pre.get("split", True):
        raise ModelDirError(
            f"{path}: the pre-tokenizer must be Metaspace with replacement '▁' and split false "
            f"(found {json.dumps(pre)[:200]}); this is not a Basal (Bielik v3) tokenizer"
        )
    if spec.get("normalizer") is not None:
        raise ModelDirError(f"{path}: a normalizer is set; Basal tokenizers have none")
    spec["pre_tokenizer"] = {**pre, "prepend_scheme": "first"}
    spec["truncation"] = None
    spec["padding"] = None
    return HFTokenizer.from_str(json.dumps(spec))


ENCODE_CHARS = 1 << 20  # characters tokenized in one batch call


class Tokenizer:
    """Prompt text -> token ids; option-letter ids; the length of the shared template prefix."""

    def __init__(self, path: Path, bos: str = "<s>"):
        self.path = path
        self.bos = bos
        self._tk = load_tokenizer_json(path)
        self._ints = tuple(range(self._tk.get_vocab_size(with_added_tokens=True)))  # shared int objects
        self._letters = self._discover_letters()
        self.prefix_len = {lang: self._template_prefix_len(lang) for lang in ("pl", "en")}

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    @property
    def max_token_chars(self) -> int:
        """Characters of the longest vocabulary entry: a text of n characters has at least n / this many tokens."""
        return max(map(len, self._tk.get_vocab(with_added_tokens=True)), default=1)

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and each token's (start, end) code-point offsets in `text` (evidence locates the state)."""
        e = self._tk.encode(text, add_special_tokens=False)
        return e.ids, [tuple(o) for o in e.offsets]

    def encode_batch(self, texts: Iterable[str]) -> list[tuple[int, ...]]:
        """Token ids of many texts, as tuples whose ints are shared (one object per vocabulary id)."""
        return list(self.encode_stream(texts))

    def encode_stream(self, texts: Iterable[str]) -> Iterator[tuple[int, ...]]:
        """Token ids of many texts, yielded in order as they are encoded.

        A request of 1,024 questions on one long state tokenizes 2,048 prompts that each repeat the state: as
        lists of fresh ints they cost ~36 bytes a token, plus the tokenizer's own per-token structures (offsets,
        token strings) for every prompt at once. Here a token costs 8 bytes of its tuple, and at most
        `ENCODE_CHARS` characters are encoded at a time, so the tokenizer's structures stay bounded. `texts` is
        read as it is encoded and the ids are yielded as they come: a caller that keeps only what it needs of
        each prompt never holds every prompt's text or ids at once."""
        batch: list[str] = []
        chars = 0
        for text in texts:
            if batch and chars + len(text) > ENCODE_CHARS:
                yield from (self._shared(e.ids) for e in self._tk.encode_batch(batch, add_special_tokens=False))
                batch, chars = [], 0
            batch.append(text)
            chars += len(text)
        if batch:
            yield from (self._shared(e.ids) for e in self._tk.encode_batch(batch, add_special_tokens=False))

    def _shared(self, ids: list[int]) -> tuple[int, ...]:
        if len(ids) < 2:
            return tuple(ids)
        return operator.itemgetter(*ids)(self._ints)

    def letter_ids(self, k: int) -> list[int]:
        """Token ids of the first `k` option letters at the answer position (same for every prompt)."""
        return self._letters[:k]

    def discover_letters(self, prompt: str, k: int) -> list[int] | None:
        """Upstream rule: ``prompt + L`` must tokenize as ``prompt`` plus exactly one new token, distinct per L."""
        base = self.encode(prompt)
        ids = []
        for letter in LETTERS[:k]:
            extended = self.encode(prompt + letter)
            if len(extended) != len(base) + 1 or extended[: len(base)] != base:
                return None
            ids.append(extended[-1])
        return ids if len(set(ids)) == len(ids) else None

    def _probe(self, lang: str, state: str) -> str:
        return render_prompt(state, "?", [f"option {c}" for c in LETTERS], lang, self.bos)

    def _discover_letters(self) -> list[int]:
        # The answer position always follows the fixed tail "<|im_start|>assistant\n{"answer": "", after a special
        # token, so the letter ids do not depend on the prompt; checked on prompts of both languages.
        found = [self.discover_letters(self._probe(lang, "x y z"), len(LETTERS)) for lang in ("pl", "en")]
        if found[0] is None or found[0] != found[1]:
            raise ModelDirError(f"{self.path}: the option letters A–J are not distinct single tokens after the prefill")
        return found[0]

    def _template_prefix_len(self, lang: str) -> int:
        """Tokens every prompt of `lang` shares (53 pl / 66 en on the real tokenizer): the template up to the state,
        cut back to what two different states tokenize identically."""
        common = self.encode(template_prefix(lang, self.bos))
        for state in ("Zażółć gęślą jaźń", '{"a": 1}'):
            ids = self.encode(self._probe(lang, state))
            n = 0
            while n < min(len(common), len(ids)) and common[n] == ids[n]:
                n += 1
            common = common[:n]
        return len(common)
