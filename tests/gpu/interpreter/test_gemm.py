"""The `tri` GEMM under the interpreter: an anchor row's bits do not depend on M, on its offset or on the tile
config; a GEMM that picks split-K by M (the way library heuristics do) is caught."""

from __future__ import annotations

import pytest
import torch

from basal.backends.cuda.gpu.kernel_configs import GEMM_REGIMES, GemmTiles, gemm_tiles
from basal.backends.cuda.gpu.triton_gemm import linear

ROW_COUNTS = [1, 2, 3, 17, 63, 64, 65, 130, 257]
CONFIGS = [t for regime in GEMM_REGIMES.values() for t in regime]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _anchor_bits(fn, x: torch.Tensor, anchor: torch.Tensor) -> set[bytes]:
    """fn over batches of every row count with the anchor first, in the middle and last -> anchor row bits."""
    out = set()
    for m in ROW_COUNTS:
        for pos in sorted({0, m // 2, m - 1}):
            rows = torch.cat([x[:pos], anchor[None], x[pos : m - 1]])
            out.add(_bits(fn(rows)[pos]))
    return out


@pytest.mark.parametrize(
    ("n", "k", "dtype"), [(24, 128, torch.float16), (16, 192, torch.bfloat16), (16, 256, torch.float32)]
)
def test_anchor_row_is_invariant_over_row_counts_and_offsets(n, k, dtype):
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(260, k, generator=g).to(dtype)
    assert len(_anchor_bits(lambda r: linear(r, w), x[1:], x[0])) == 1
    ref = x[:5].double() @ w.double().T
    tol = 1e-4 if dtype == torch.float32 else 0.1
    assert (linear(x[:5], w).double() - ref).abs().max() <= tol * k**0.5


def test_every_tile_config_gives_the_same_bits():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 128, generator=g).half()
    x = torch.randn(130, 128, generator=g).half()
    results = {_bits(linear(x, w, tiles=t)) for t in [*CONFIGS, gemm_tiles(64, 128), GemmTiles(16, 16, 4, 4)]}
    assert len(results) == 1


def test_k_tail_is_masked():
    """K not a multiple of BK (the demo model's 176): masked loads add exact zeros."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(24, 176, generator=g)
    x = torch.randn(9, 176, generator=g)
    assert (linear(x, w).double() - x.double() @ w.double().T).abs().max() <= 1e-4


def test_negative_control_split_k_chosen_by_m():
    """Split-K for small M, one accumulator otherwise — the anchor test must see two results."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 256, generator=g)
    x = torch.randn(260, 256, generator=g)
    assert len(_anchor_bits(lambda r: linear(r, w, split_k=2 if r.shape[0] < 64 else 1), x[1:], x[0])) > 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fused_epilogues_keep_the_bits_of_the_separate_kernels(dtype):
    """`residual` = the GEMM then the norm kernel's add; `swiglu` = the [gate; up] GEMM then the SwiGLU kernel;
    both bitwise, and the fused rows are as invariant over M as the plain GEMM's."""
    from basal.backends.cuda.gpu import triton_rowwise as rows

    g = torch.Generator().manual_seed(4)
    xs = torch.randn(260, 96, generator=g).to(dtype)
    x = xs[:130]
    w = (torch.randn(48, 96, generator=g) * 0.2).to(dtype)  # [gate; up] of F = 24, or a plain [48, 96]
    h = torch.randn(130, 48, generator=g).to(dtype)
    added = h.clone()
    rows.rmsnorm(added, torch.ones(48, dtype=dtype), 1e-5, torch.empty_like(h), linear(x, w))  # h += y in place
    in_place = h.clone()
    linear(x, w, out=in_place, epilogue="residual", residual=in_place)
    assert _bits(in_place) == _bits(added)
    separate = torch.empty(130, 24, dtype=dtype)
    rows.swiglu(linear(x, w), separate)
    assert _bits(linear(x, w, epilogue="swiglu")) == _bits(separate)
    assert len(_anchor_bits(lambda r: linear(r, w, epilogue="swiglu"), xs[1:], xs[0])) == 1


def test_fused_epilogue_arguments_are_checked():
    w, x = torch.zeros(16, 64), torch.zeros(4, 64)
    with pytest.raises(ValueError, match="residual"):
        linear(x, w, epilogue="residual")
    with pytest.raises(ValueError, match="residual"):
        linear(x, w, residual=torch.zeros(4, 16))
    with pytest.raises(ValueError, match="contiguous"):
        linear(x, w, epilogue="residual", residual=torch.zeros(4, 8))


def test_the_probe_fuses_a_shape_only_when_its_fused_kernel_is_invariant(monkeypatch):
    from basal.backends.cuda.gpu import gemm_table as gt

    def table():
        return gt.probe(
            [(48, 256), (24, 256)], torch.float32, torch.device("cpu"), [1, 3, 17, 40], {"gpu": "cpu"}, ("tri",),
            timing_rows=None, epilogues={(48, 256): "swiglu", (24, 256): "residual"},
        )  # fmt: skip

    probed = table()
    assert probed.fused(48, 256) == "swiglu" and probed.fused(24, 256) == "residual"

    def by_m(epilogue):  # negative control: a "fused" kernel whose arithmetic depends on M
        return lambda x, w, out: linear(x, w, split_k=2 if x.shape[0] < 8 else 1)

    monkeypatch.setattr(gt, "fused_gemm", by_m)
    refused = table()
    assert refused.fused(48, 256) == "" and "rows differ at M=1" in refused.shapes[0].fused_detail
    assert refused.shapes[0].gemm == "tri"  # the plain GEMM still serves the shape, with separate kernels
