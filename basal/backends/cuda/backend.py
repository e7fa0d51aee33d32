"""TorchBackend: loads a model directory and runs packed forwards (CUDA, or CPU for development and CI)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Generator, Sequence

import numpy as np
import torch

from basal.backends.cuda import tile_rows
from basal.backends.cuda.cpu import cpu_kernels
from basal.backends.cuda.cpu.gemm_chunks import process_table
from basal.backends.cuda.cpu.threads import configure_threads
from basal.backends.cuda.model import TORCH_DTYPE, LlamaWeights, TreeLlama, head_logsumexp
from basal.core.model.model_dir import ModelDir
from basal.core.packing.backend import Backend
from basal.core.packing.tree import PackedForward

log = logging.getLogger(__name__)
# said where CUDA is there but Triton is not (the load's warning, `basal doctor`)
NO_TRITON = (
    "the portable torch path serves (bitwise invariant, but many times slower than the GPU path): "
    "pip install 'basal-bitwise[cuda]' (Linux; the Triton that fits the installed torch) for the GPU path"
)


def gpu_path_installed() -> bool:
    """Whether the GPU path (basal.backends.cuda.gpu) can serve on a CUDA device here: it needs Triton."""
    return importlib.util.find_spec("triton") is not None


class TorchBackend:
    name = "torch"
    reads_hidden_states = True
    caches_states = True

    def __init__(
        self, model: ModelDir, dtype: str, device: torch.device, fixed_shapes: bool = True, gemm_chunks: str = "probe"
    ):
        """`gemm_chunks`: "probe" picks GEMM row chunks per weight shape on the CPU (`gemm_chunks.py`); "fixed"
        keeps the first version's 64-row chunks (CUDA always does)."""
        if gemm_chunks not in ("probe", "fixed"):
            raise ValueError(f"gemm_chunks must be 'probe' or 'fixed', got {gemm_chunks!r}")
        self.model = model
        self.dtype = dtype
        self.device = str(device)
        probe = gemm_chunks == "probe" and device.type == "cpu" and fixed_shapes
        self.net = TreeLlama(
            LlamaWeights(model, TORCH_DTYPE[dtype], device), fixed_shapes, process_table() if probe else None
        )

    def describe(self) -> dict[str, object]:
        """What decides this backend's bits and speed on this machine: device, dtype, threads, and the GEMM
        row-chunk sizes per weight shape (for `basal doctor`, /v1/models and exports)."""
        chunks = self.net.chunks
        return {
            "backend": self.name,
            "device": self.device,
            "dtype": self.dtype,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "gemm_chunks": "fixed 64 rows (16 at readouts)" if chunks is None else chunks.describe(self.net._gemms()),
            "attention_gemm_rows": tile_rows.describe(self.net.cfg, self.device),
            **({"cpu_kernels": cpu_kernels.kind()} if self.device == "cpu" else {}),
        }

    @classmethod
    def load(
        cls,
        model: ModelDir,
        dtype: str | None = None,
        device: str | None = None,
        fixed_shapes: bool = True,
        gemm_chunks: str = "probe",
    ) -> Backend:
        """f16 by default on CUDA; f32 on the CPU (the numerical reference; bf16 and f16 work there too). On CUDA
        with Triton installed the GPU path (basal.backends.cuda.gpu) serves; `fixed_shapes=False` keeps this
        class's plain path there too (the negative control)."""
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dev.type == "cuda" and fixed_shapes:
            if gpu_path_installed():
                from basal.backends.cuda.gpu.backend import GpuBackend

                return GpuBackend.load(model, dtype, str(dev))
            log.warning("CUDA without Triton: %s", NO_TRITON)
        if dtype is None:
            dtype = "f16" if dev.type == "cuda" else "f32"
        if dev.type == "cpu":
            configure_threads()  # physical cores, unless the config or OMP_NUM_THREADS chose (threads.py)
            cpu_kernels.load()  # built (about a second, once per machine) at load, not at the first request
        if dev.type == "cuda":
            # no TF32, no reduced-precision split reductions (docs/determinism.md §1)
            from basal.backends.cuda.gpu.environment import disallow_reduced_reductions

            torch.backends.cuda.matmul.allow_tf32 = False
            disallow_reduced_reductions()  # split-K off too: a plain False would allow it for the whole process
        with torch.inference_mode():
            backend = cls(model, dtype, dev, fixed_shapes, gemm_chunks)
            tile_rows.for_model(model.config, dev)  # the tile GEMMs' row probe, once per shape (tile_rows.py)
            return backend

    def prefix(self, key: str, tokens: Sequence[int], base: str | None = None) -> int:
        with torch.inference_mode():
            return self.net.compute_prefix(key, list(tokens), base)

    def drop_prefix(self, key: str) -> None:
        self.net.prefix_kv.pop(key, None)

    def prefix_bytes(self, key: str) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.net.prefix_kv.get(key, ()))

    def reserve_states(self, nbytes: int) -> int:
        """Nothing: an entry is tensors of its own, made when it is filled."""
        return 0

    def prepare(self, packed: PackedForward) -> None:
        """Nothing: this path reads the packed forward as it is, under the gate."""
        return None

    def warm_up(self) -> int:
        """Nothing to warm: the GEMM probe and the compiled CPU kernels ran at load."""
        return 0

    def run(
        self, packed: PackedForward, prepared: None = None, preemptible: bool = False
    ) -> Generator[None, None, np.ndarray]:
        """Every pass of this path can pause at any yield, so `preemptible` changes nothing here."""
        with torch.inference_mode():
            t = self.net.inputs(packed)
            tokens = torch.from_numpy(packed.tokens.astype(np.int64)).to(self.net.w.device)
        letters = tuple(int(x) for x in packed.letter_ids)
        return (yield from self.net.forward(t, tokens, letters))

    def run_with_hidden(self, packed: PackedForward) -> Generator[None, None, tuple[np.ndarray, np.ndarray]]:
        """`run`, and the final-normed hidden states f32 [R + H, d] of the readouts, then of `packed.hidden`: the
        last layer runs at those rows too (evidence questions only; the readouts keep their bits)."""
        wide = packed.with_hidden_as_readouts()
        with torch.inference_mode():
            t = self.net.inputs(wide)
            tokens = torch.from_numpy(wide.tokens.astype(np.int64)).to(self.net.w.device)
        letters = tuple(int(x) for x in packed.letter_ids)
        logits, states = yield from self.net.forward_with_states(t, tokens, letters)
        with torch.inference_mode():
            return logits[: len(packed.readouts)], states.cpu().numpy()

    def vocab_logsumexp(self, states: np.ndarray) -> np.ndarray:
        """The whole head, read from the memory map a chunk at a time (diagnostics only; nothing is kept)."""
        w = self.net.w
        return head_logsumexp(w.head_rows, w.vocab_size, states, w.device)
