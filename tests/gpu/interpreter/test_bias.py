"""basal-1.0 checkpoints on the GPU path, under the interpreter: the `tri` GEMM adds a bias before its one rounding,
in every epilogue, with the bits of the separate kernels and invariant over M; the GEMM probe runs with the bias;
and a biased checkpoint loads straight to the device and gives a question the same bits alone and in a batch,
close to the torch CPU f32 backend."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from basal.backends.cuda.backend import TorchBackend
from basal.backends.cuda.gpu import gemm_table as gt
from basal.backends.cuda.gpu import triton_rowwise as rows
from basal.backends.cuda.gpu.backend import GpuBackend
from basal.backends.cuda.gpu.triton_gemm import linear
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion, split_forwards


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _data(dtype, m: int = 130, n: int = 48, k: int = 96):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.2).to(dtype)  # [gate; up] of F = 24, or a plain [48, 96]
    return x, w, torch.randn(n, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_the_bias_is_added_before_the_rounding(dtype):
    x, w, b = _data(dtype)
    exact = x.double() @ w.double().T + b.double()
    assert (linear(x, w, bias=b).double() - exact).abs().max() <= (1e-4 if dtype == torch.float32 else 0.05)
    assert _bits(linear(x, w, bias=b)) != _bits(linear(x, w))  # it is there at all


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_fused_epilogues_with_a_bias_keep_the_separate_bits_and_the_rows_invariance(dtype):
    x, w, b = _data(dtype)
    h = torch.randn(x.shape[0], w.shape[0], generator=torch.Generator().manual_seed(7)).to(dtype)
    added = h.clone()
    rows.rmsnorm(added, torch.ones(w.shape[0], dtype=dtype), 1e-5, torch.empty_like(h), linear(x, w, bias=b))
    in_place = h.clone()
    linear(x, w, out=in_place, epilogue="residual", residual=in_place, bias=b)
    assert _bits(in_place) == _bits(added)
    separate = torch.empty(x.shape[0], w.shape[0] // 2, dtype=dtype)
    rows.swiglu(linear(x, w, bias=b), separate)
    assert _bits(linear(x, w, epilogue="swiglu", bias=b)) == _bits(separate)
    anchor = linear(x[:1], w, epilogue="swiglu", bias=b)[0]
    for m in (1, 3, 17, 64, 130):
        for pos in sorted({0, m // 2, m - 1}):
            batch = torch.cat([x[1 : pos + 1], x[:1], x[pos + 1 : m]])
            assert _bits(linear(batch, w, epilogue="swiglu", bias=b)[pos]) == _bits(anchor), (m, pos)


def test_a_bias_of_the_wrong_shape_is_refused():
    x, w, b = _data(torch.float32)
    with pytest.raises(ValueError, match="bias"):
        linear(x, w, bias=b[:-1])


def test_the_probe_runs_the_gemms_with_the_bias():
    table = gt.probe(
        [(48, 96)], torch.float32, torch.device("cpu"), [1, 3, 17], {"gpu": "cpu"}, ("tri",), timing_rows=None,
        epilogues={(48, 96): "swiglu"}, bias=True,
    )  # fmt: skip
    (entry,) = table.shapes
    assert entry.bias and entry.gemm == "tri" and entry.fused == "swiglu"
    assert gt.GemmTable.from_json(table.to_json()).shapes[0].bias
    assert "48 x 96     +bias -> tri" in "\n".join(gt.describe(table, "current"))


@pytest.fixture(scope="module")
def short_batches(biased_model):
    """Two short questions (random token ids, no template: the interpreter is slow), alone and together."""
    rng = random.Random(4)
    vocab = biased_model.config.vocab_size

    def question(i: int) -> TokenizedQuestion:
        shared = tuple(rng.randrange(vocab) for _ in range(7))
        return TokenizedQuestion("en", f"s{i}", tuple((*shared, rng.randrange(vocab)) for _ in range(2)))

    qs = [question(0), question(1)]
    letters = [5, 6, 7]
    alone = [split_forwards([q], letters, {})[0].packed for q in qs]
    (together,) = split_forwards(qs, letters, {})
    return alone, together.packed


def test_a_biased_checkpoint_gives_the_same_bits_alone_and_in_a_batch(biased_model, short_batches):
    gpu = GpuBackend.load(biased_model, dtype="f32", device="cpu", arena_tokens=32, progress=False)
    assert gpu.weights.layers[0].qkv_bias is not None and all(s.bias for s in gpu.table.shapes)
    alone, together = short_batches
    batched = run_to_end(gpu.run(together))
    singles = np.concatenate([run_to_end(gpu.run(b)) for b in alone])
    assert singles.tobytes() == batched.tobytes()
    cpu = run_to_end(TorchBackend.load(biased_model, dtype="f32", device="cpu").run(together))
    assert np.abs(batched - cpu).max() <= 1e-3 * max(1.0, float(np.abs(cpu).max()))
