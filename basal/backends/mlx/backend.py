"""MLXBackend: Metal kernels on Apple Silicon, portable MLX ops on the CPU (mlx[cpu] on Linux)."""

from __future__ import annotations

from collections.abc import Generator, Sequence

import mlx.core as mx
import numpy as np

from basal.backends.mlx.device_scope import Scope, on_device
from basal.backends.mlx.model import MLXLlama
from basal.backends.mlx.precision import require_full_f32
from basal.core.model.model_dir import ModelDir
from basal.core.packing.tree import PackedForward


class MLXBackend:
    name = "mlx"
    reads_hidden_states = True
    caches_states = True

    def __init__(self, model: ModelDir, dtype: str, device: str, fixed_shapes: bool = True):
        self.model, self.dtype, self.device = model, dtype, device
        mx_device = mx.gpu if device == "metal" else mx.cpu
        # where every op of this backend runs; the process default is never set (device_scope.py)
        self.scope: Scope = mx_device
        if dtype == "f32":  # the reference mode: no reduced-precision f32 matmuls (M5 class GPUs)
            require_full_f32(mx_device)
        with mx.stream(self.scope):
            self.net = MLXLlama(model, dtype, use_metal=device == "metal", fixed_shapes=fixed_shapes)

    @staticmethod
    def devices() -> list[str]:
        """Devices this machine runs: "metal" on Apple Silicon, always "cpu"."""
        return (["metal"] if mx.metal.is_available() else []) + ["cpu"]

    @classmethod
    def load(
        cls, model: ModelDir, dtype: str | None = None, device: str | None = None, fixed_shapes: bool = True
    ) -> MLXBackend:
        """f16 by default on Metal, f32 on the CPU. `fixed_shapes=False` is the negative control (see MLXLlama)."""
        device = device or cls.devices()[0]
        if device not in cls.devices():
            raise ValueError(f"MLX device {device!r} is not available here; available: {', '.join(cls.devices())}")
        return cls(model, dtype or ("f16" if device == "metal" else "f32"), device, fixed_shapes)

    def prefix(self, key: str, tokens: Sequence[int], base: str | None = None) -> int:
        with mx.stream(self.scope):
            return self.net.compute_prefix(key, list(tokens), base)

    def drop_prefix(self, key: str) -> None:
        self.net.prefix_kv.pop(key, None)

    def prefix_bytes(self, key: str) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.net.prefix_kv.get(key, ()))

    def reserve_states(self, nbytes: int) -> int:
        """Nothing: an entry is tensors of its own, made when it is filled."""
        return 0

    def prepare(self, packed: PackedForward) -> None:
        """Nothing: MLX builds its inputs from the packed forward under the gate."""
        return None

    def warm_up(self) -> int:
        """Nothing to warm: the Metal kernels compile at load."""
        return 0

    def describe(self) -> dict[str, object]:
        """Backend, device, dtype and the MLX version: what decides this backend's bits here."""
        return {
            "backend": self.name,
            "device": self.device,
            "dtype": self.dtype,
            "mlx": mx.__version__,
            "kernels": "metal" if self.device == "metal" else "mlx ops",
        }

    def run(
        self, packed: PackedForward, prepared: None = None, preemptible: bool = False
    ) -> Generator[None, None, np.ndarray]:
        """Every pass can pause at any yield, so `preemptible` changes nothing here."""
        return (yield from on_device(self.scope, self._run(packed)))

    def run_with_hidden(self, packed: PackedForward) -> Generator[None, None, tuple[np.ndarray, np.ndarray]]:
        """`run`, and the final-normed hidden states f32 [R + H, d] of the readouts, then of `packed.hidden`: the
        last layer runs at those rows too (evidence questions only; the readouts keep their bits)."""
        return (yield from on_device(self.scope, self._run_with_hidden(packed)))

    def vocab_logsumexp(self, states: np.ndarray) -> np.ndarray:
        """The whole head, a chunk of rows at a time (diagnostics only), on this backend's device."""
        with mx.stream(self.scope):
            return self.net.vocab_logsumexp(states)

    def _run(self, packed: PackedForward) -> Generator[None, None, np.ndarray]:
        t = self.net.inputs(packed)
        letters = tuple(int(x) for x in packed.letter_ids)
        return (yield from self.net.forward(t, packed.tokens, letters))

    def _run_with_hidden(self, packed: PackedForward) -> Generator[None, None, tuple[np.ndarray, np.ndarray]]:
        wide = packed.with_hidden_as_readouts()
        t = self.net.inputs(wide)
        letters = tuple(int(x) for x in packed.letter_ids)
        logits, states = yield from self.net.forward_with_states(t, wide.tokens, letters)
        return logits[: len(packed.readouts)], np.array(states)
