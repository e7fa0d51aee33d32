"""A backend that answers from the prompt text: upstream's server tests with a stub model, reproduced.

`rule(prompt, k)` returns the letter probabilities of one prompt (k letters); the stub rebuilds every readout's
prompt from the packed batch (template prefix + the blocks on its chain), decodes it and returns log(p) as the
letter logits, so everything from planning to the answer runs as in production, except the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from basal.core.model.model_dir import ModelDir
from basal.core.packing.tree import PackedForward

Rule = Callable[[str, int], Sequence[float]]


class FakeBackend:
    """The members of `Backend` that a test double has nothing to do for: no host preparation, no warm-up, no
    hidden states. A double subclasses it and writes `prefix` and `run`."""

    name, device, dtype = "fake", "cpu", "f32"
    reads_hidden_states = False
    caches_states = False  # a double that keeps prefixes with a base says so (StubBackend)

    def prepare(self, batch: PackedForward) -> None:
        return None

    def run_with_hidden(self, batch: PackedForward):
        raise RuntimeError(f"the {self.name} test backend reads no hidden states")

    def vocab_logsumexp(self, states):
        raise RuntimeError(f"the {self.name} test backend reads no hidden states")

    def describe(self) -> dict[str, object]:
        return {"backend": self.name, "device": self.device, "dtype": self.dtype}

    def warm_up(self) -> int:
        return 0

    def reserve_states(self, nbytes: int) -> int:
        return 0


class StubBackend(FakeBackend):
    name, device, dtype = "stub", "cpu", "f32"
    caches_states = True

    def __init__(self, model: ModelDir, rule: Rule):
        self.model, self.rule = model, rule
        self.prefixes: dict[str, list[int]] = {}
        self.prompts: list[str] = []  # every prompt read out, in order

    def prefix(self, key: str, tokens: Sequence[int], base: str | None = None) -> int:
        self.prefixes[key] = ([] if base is None else list(self.prefixes[base])) + list(tokens)
        return 8 * len(self.prefixes[key])

    def drop_prefix(self, key: str) -> None:
        self.prefixes.pop(key, None)

    def prefix_bytes(self, key: str) -> int:
        return 8 * len(self.prefixes.get(key, ()))

    def _prompt(self, batch: PackedForward, readout: int) -> str:
        blocks = batch.chain(int(batch.block_of[readout]))
        root = blocks[0]
        ids = list(self.prefixes[batch.prefix_keys[batch.block_prefix[root]]]) if batch.block_prefix[root] >= 0 else []
        for b in blocks:
            start = int(batch.block_start[b])
            end = readout + 1 if b == blocks[-1] else start + int(batch.block_len[b])
            ids += batch.tokens[start:end].tolist()
        return self.model.tokenizer._tk.decode(ids, skip_special_tokens=False)

    def run(self, batch: PackedForward, prepared=None, preemptible=False):
        out = np.full((len(batch.readouts), len(batch.letter_ids)), -1e4, dtype=np.float32)
        for r, flat in enumerate(batch.readouts):
            prompt = self._prompt(batch, int(flat))
            self.prompts.append(prompt)
            k = sum(f"\n{letter}. " in prompt for letter in "ABCDEFGHIJ")
            p = np.asarray(self.rule(prompt, k), dtype=np.float64)
            out[r, : len(p)] = np.log(p)
        yield
        for key, base, rows in batch.fills:  # as `prefix` would: the prefix's ids, then the rows'
            self.prefixes[key] = list(self.prefixes[base]) + batch.tokens[rows].tolist()
        return out
