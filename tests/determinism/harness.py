"""One runner for every backend × dtype: random questions, packed any way, compared as bit patterns."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from basal.backends.load import load_backend_class
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import option_orders, render_prompt
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion

WORDS = {
    "pl": "zamówienie klient paczka dotarła uszkodzona zwrot faktura termin płatność źle żółw gęś".split(),
    "en": "order customer package arrived damaged refund invoice deadline payment late box item".split(),
}


def available() -> list[tuple[str, str, str]]:
    """(backend, device, dtype) combinations this machine can run."""
    import torch

    combos = [("torch", "cpu", dt) for dt in ("f32", "bf16", "f16")]
    if torch.cuda.is_available():
        combos += [("torch", "cuda", dt) for dt in ("f32", "f16", "bf16")]
    mlx = load_backend_class("mlx")
    if mlx is not None:
        combos += [("mlx", dev, dt) for dev in mlx.devices() for dt in ("f32", "bf16", "f16")]
    return combos


def combo_id(combo: tuple[str, str, str]) -> str:
    return "-".join(combo)


class Harness:
    """Tokenized random questions and a way to run any subset, packed together, with or without the cache."""

    def __init__(self, model: ModelDir, backend: str, device: str, dtype: str, **backend_options):
        cls = load_backend_class(backend)
        self.backend = cls.load(model, dtype=dtype, device=device, **backend_options)
        self.cached = Pipeline(model, self.backend, prefix_cache=True)
        self.uncached = Pipeline(model, self.backend, prefix_cache=False)
        self.tok = model.tokenizer

    def question(
        self,
        rng: random.Random,
        lang: str,
        state: str | None = None,
        k: int | None = None,
        state_words: int | None = None,
    ) -> TokenizedQuestion:
        words = WORDS[lang]
        if state is None:
            state = " ".join(rng.choice(words) for _ in range(state_words or rng.randint(1, 60)))
        k = k or rng.randint(2, 10)
        question = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) + "?"
        options = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 4))) for _ in range(k)]
        prompts = tuple(
            tuple(self.tok.encode(render_prompt(state, question, [options[i] for i in perm], lang)))
            for perm in option_orders(k)
        )
        return TokenizedQuestion(lang, state, prompts)

    def logits(self, questions: Sequence[TokenizedQuestion], cache: bool = True) -> list[list[np.ndarray]]:
        pipeline = self.cached if cache else self.uncached
        return run_to_end(pipeline.letter_logits(questions))


def bits(x: np.ndarray) -> bytes:
    """The bit pattern of a float32 vector (so -0.0 != 0.0 and NaN == NaN)."""
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).tobytes()


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return [bits(x) for x in a] == [bits(x) for x in b]
