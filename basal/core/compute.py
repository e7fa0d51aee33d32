"""What core needs from a compute backend (the protocol every backend implements; backends/base.py selects one).

It lives in core because core drives backends (the engine pauses long passes between layers); backends import
core types, never the other way round.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Protocol

import numpy as np

from basal.core.model_dir import ModelDir
from basal.core.tree import PackedBatch


class Backend(Protocol):
    name: str  # "torch" | "mlx"
    device: str  # "cpu", "cuda", "metal", ...
    dtype: str  # "f32" | "f16" | "bf16"
    model: ModelDir

    def prefix(self, key: str, tokens: Sequence[int]) -> None:
        """Compute and keep the K/V of a template prefix (positions 0..n-1); batches refer to it by `key`."""
        ...

    def run(self, batch: PackedBatch) -> Generator[None, None, np.ndarray]:
        """Forward over the packed tree; yields after every layer; returns float32[readouts, letters]."""
        ...


def run_to_end(steps: Generator[None, None, np.ndarray]) -> np.ndarray:
    """Drive a `Backend.run` generator without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
