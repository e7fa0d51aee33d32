"""What core needs from a compute backend (the protocol every backend implements; backends/load.py selects one).

It lives in core because core drives backends (the engine pauses long passes at every yield of `run`); backends import
core types, never the other way round.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

import numpy as np

from basal.core.model.model_dir import ModelDir
from basal.core.packing.tree import PackedForward


class Backend(Protocol):
    """Everything core asks of a compute backend. Every backend implements every member; where one has nothing to
    do for a capability (no host-side preparation, no warm-up), the member says so in its result."""

    name: str  # "torch" | "mlx"
    device: str  # "cpu", "cuda", "metal", ...
    dtype: str  # "f32" | "f16" | "bf16"
    model: ModelDir
    reads_hidden_states: bool  # `run_with_hidden` works: the evidence head can be served
    caches_states: bool  # `prefix` takes a `base` and prefixes come and go cheaply: the state cache can be used

    def prefix(self, key: str, tokens: Sequence[int], base: str | None = None) -> int:
        """Compute and keep the K/V of a prefix (positions 0..n-1: a template prefix, or a state with its template);
        forwards refer to it by `key`. `base`: a cached prefix that `tokens` continue (positions len(base)..), whose
        K/V the new entry starts with. Set only once complete. -> the bytes the entry holds."""
        ...

    def drop_prefix(self, key: str) -> None:
        """Forget a cached prefix (the state cache evicts it); nothing if there is none."""
        ...

    def prefix_bytes(self, key: str) -> int:
        """The bytes a cached prefix holds; 0 if there is none."""
        ...

    def reserve_states(self, nbytes: int) -> int:
        """The state cache is on with a budget of `nbytes` (called once the template prefixes are set, before
        `warm_up`): a backend that keeps entries in buffers it must size up front (the GPU path: fixed addresses
        that CUDA graphs read) allocates them now. -> the bytes it set aside; 0 where entries are tensors of their
        own, made and freed as they come and go."""
        ...

    def prepare(self, packed: PackedForward) -> Any:
        """The host work of a pass, done while packing, before the device is taken (the GPU path: the tile layout
        and the metadata blob); `run` gets it back as `prepared`. None from a backend that has no such work."""
        ...

    def run(
        self, packed: PackedForward, prepared: Any = None, preemptible: bool = False
    ) -> Generator[Any, None, np.ndarray]:
        """Forward over the packed tree; returns float32[readouts, letters].

        Every yield is a pause point: the engine may run other passes there (a long lane steps aside for a main
        lane) before it resumes the pass. A backend yields at least after every layer, and may yield inside a
        layer too (the torch backend does between GEMM row chunks and key-tile spans, so that one long layer does
        not hold the device for seconds). A pause must never change the result: the pass keeps its tensors and
        its arithmetic across it, and leaves no state behind that other passes would see.

        `packed.fills` (only where `caches_states`): the K/V of those rows, after their prefix's, are kept as new
        prefixes once every layer is done, as `prefix` would compute and set them (the same bits).

        `prepared`: what `prepare(packed)` returned. `preemptible`: the long lane's pass, which must be able to
        pause between layers (the GPU path then replays no graph; same kernels, same bits).

        A backend on an asynchronous device may yield `passes.QUEUED` once instead of None, when all of the
        pass's device work is queued and only its readback is left: the pipeline then queues its next forward
        before it waits for this one's result. A pass with another one started after its QUEUED must still
        give the same result."""
        ...

    def run_with_hidden(self, packed: PackedForward) -> Generator[Any, None, tuple[np.ndarray, np.ndarray]]:
        """`run`, and the final-normed hidden states f32 [R + H, d] of the readouts, then of `packed.hidden`
        (evidence questions); the readouts keep the bits `run` gives them. Only called where
        `reads_hidden_states`."""
        ...

    def vocab_logsumexp(self, states: np.ndarray) -> np.ndarray:
        """log sum_v exp(lm_head[v] . h) over the whole vocabulary, for final-normed hidden states f32 [n, d] as
        `run_with_hidden` gives them -> float64 [n]: the softmax normaliser at those rows, from which diagnostics
        compute the letters' share of the full-vocabulary probability. Asked only by a request that wants
        diagnostics, so it may read the whole head; only called where `reads_hidden_states`."""
        ...

    def describe(self) -> dict[str, object]:
        """What decides this backend's bits and speed here (backend, device, dtype, library versions, threads,
        kernel choices): `basal doctor`, `/v1/models` and exports show it."""
        ...

    def warm_up(self) -> int:
        """Work done once before serving so that the first requests do not pay for it (the GPU path captures CUDA
        graphs of the common buckets) -> how many things it prepared; 0 where a backend has nothing to warm."""
        ...
