"""What core needs from a compute backend (the protocol every backend implements; backends/base.py selects one).

It lives in core because core drives backends (the engine pauses long passes at every yield of `run`); backends import
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
        """Forward over the packed tree; returns float32[readouts, letters].

        Every yield is a pause point: the engine may run other batches there (a long lane steps aside for a main
        lane) before it resumes the pass. A backend yields at least after every layer, and may yield inside a
        layer too (the torch backend does between GEMM row chunks and key-tile spans, so that one long layer does
        not hold the device for seconds). A pause must never change the result: the pass keeps its tensors and
        its arithmetic across it, and leaves no state behind that other batches would see.

        A backend on an asynchronous device may yield `overlap.QUEUED` once instead of None, when all of the
        pass's device work is queued and only its readback is left: the pipeline then queues its next forward
        before it waits for this one's result. A pass with another one started after its QUEUED must still
        give the same result."""
        ...


def run_to_end(steps: Generator[None, None, np.ndarray]) -> np.ndarray:
    """Drive a `Backend.run` generator without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
