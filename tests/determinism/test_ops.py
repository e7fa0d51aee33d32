"""Op-level invariance of the torch kernels (docs/determinism.md §2): an anchor row's bits do not depend
on how many rows run with it or where it sits; the library ops they replace do (negative control)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from basal.backends.cuda import ops as K
from basal.core.packing.attention_layout import lay_out_attention

ROW_COUNTS = [1, 2, 3, 4, 7, 8, 15, 16, 17, 63, 64, 65, 131, 257]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _anchor_results(fn, anchor: torch.Tensor, filler: torch.Tensor):
    """fn over batches of every size with the anchor first, in the middle and last -> anchor row bits."""
    out = set()
    for m in ROW_COUNTS:
        for pos in {0, m // 2, m - 1}:
            rows = torch.cat([filler[:pos], anchor[None], filler[pos : m - 1]])
            out.add(_bits(fn(rows)[pos]))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_row_invariance(dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(384, 512, generator=g).to(dtype)
    x = torch.randn(300, 512, generator=g).to(dtype)
    assert len(_anchor_results(lambda r: K.linear(r, w, None, K.ROWS), x[0], x[1:])) == 1


def test_plain_linear_is_not_invariant():
    """Negative control: torch's f32 CPU GEMM changes its arithmetic with the row count."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(384, 512, generator=g), torch.randn(300, 512, generator=g)
    assert len(_anchor_results(lambda r: K.linear(r, w, None, K.ROWS, fixed=False), x[0], x[1:])) > 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_row_invariance(dtype):
    g = torch.Generator().manual_seed(1)
    w = torch.rand(1536, generator=g).to(dtype)
    x = torch.randn(300, 1536, generator=g).to(dtype)
    assert len(_anchor_results(lambda r: K.rms_norm(r, w, 1e-5, K.ROWS), x[0], x[1:])) == 1


def test_swiglu_row_invariance_and_library_silu_is_not():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(600, 2 * 88, generator=g) * 4

    def ours(r):
        return K.swiglu(r)

    def library(r):  # SIMD body and scalar tail round differently; where the tail falls depends on the size
        gate, up = r.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate.contiguous()) * up

    sizes = [1, 64, 117, 233, 423]
    full_ours, full_library = ours(x), library(x)
    assert all(_bits(ours(x[:m])) == _bits(full_ours[:m]) for m in sizes)
    assert any(_bits(library(x[:m])) != _bits(full_library[:m]) for m in sizes)


def test_det_exp_is_accurate():
    x = torch.cat([torch.linspace(-110, 90, 200_001), torch.tensor([float("-inf"), 0.0, -0.0, 1e-30])])
    ours = K.det_exp(x).double()
    exact = torch.exp(x.double())
    finite = (exact < torch.finfo(torch.float32).max) & (exact > 1e-37)  # normal f32 results
    rel = ((ours - exact).abs() / exact)[finite]
    assert rel.max() < 2.4e-7  # two f32 ulp (1.2 measured)
    assert ours[-4] == 0 and ours[-3] == 1 and ours[-2] == 1
    assert torch.isinf(K.det_exp(torch.tensor([100.0])))[0]


def _exp_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    special = [0.0, -0.0, float("-inf"), float("inf"), K._EXP_MIN, K._EXP_MAX, -87.5, -87.3, 88.5, 88.72, 100.0]
    edges = torch.arange(-127, 130).float() * 0.6931471805599453  # around every n = round(x / ln 2)
    edges = torch.cat([edges + d for d in (-1e-3, -1e-6, 0.0, 1e-6, 1e-3)])
    return torch.cat([torch.randn(300_000, generator=g) * 40, edges, torch.tensor(special)])


def test_det_exp_keeps_main_bits_in_blocks_and_nonpositive(monkeypatch):
    """The blocked, fewer-pass det_exp gives main's whole-tensor formulation's bits (bench/lab/baselines/main_path.py)
    at any
    block size, and det_exp_nonpositive gives det_exp's bits on x <= 0; torch.exp does not (control)."""
    from bench.lab.baselines import main_path

    x = _exp_inputs()
    reference = _bits(main_path.det_exp(x))
    for block in (1000, K.EXP_BLOCK, 1 << 40):
        monkeypatch.setattr(K, "EXP_BLOCK", block)
        assert _bits(K.det_exp(x)) == reference, block
    nonpositive = torch.cat([-x.abs(), torch.tensor([float("-inf")])])
    assert _bits(K.det_exp_nonpositive(nonpositive)) == _bits(main_path.det_exp(nonpositive))
    assert _bits(torch.exp(nonpositive)) != _bits(K.det_exp_nonpositive(nonpositive))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunk_outputs_keep_main_bits(dtype):
    """GEMM, norm and swiglu chunks written into one output give the bits of main's chunks joined by cat."""
    from basal.backends.cuda.cpu.gemm_chunks import ChunkSizes
    from basal.core.packing.passes import run_to_end
    from bench.lab.baselines import main_path

    g = torch.Generator().manual_seed(4)
    x = (torch.randn(333, 2 * 176, generator=g) * 4).to(dtype)
    w, bias = torch.randn(96, 2 * 176, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    for rows in (K.ROWS, ChunkSizes(128, (8, 32, 128), True)):
        for b in (None, bias):
            new, old = K.linear(x, w, b, rows), run_to_end(main_path.linear_steps(x, w, b, rows))
            assert _bits(new) == _bits(old), (rows, b is None)
    scale = torch.rand(2 * 176, generator=g).to(dtype)
    assert _bits(K.rms_norm(x, scale, 1e-5, K.ROWS)) == _bits(main_path.rms_norm(x, scale, 1e-5, K.ROWS))
    assert _bits(K.swiglu(x)) == _bits(main_path.swiglu(x))


def test_rope_table_matches_direct_formula():
    cos, sin = K.rope_tables(512, 16, 10000.0)
    pos = torch.tensor([0, 1, 63, 64, 511])
    inv = 1.0 / (10000.0 ** (np.arange(0, 16, 2) / 16))
    np.testing.assert_allclose(cos[pos, :8].numpy(), np.cos(np.outer(pos.numpy(), inv)), atol=1e-4)
    assert torch.equal(cos[:, :8], cos[:, 8:]) and torch.equal(sin[0], torch.zeros(16))


@pytest.mark.parametrize("prefix", [1, K.KEY_TILE - 1, K.KEY_TILE, K.KEY_TILE + 1, 2 * K.KEY_TILE + 5])
def test_attention_query_alone_vs_in_a_packed_tree(prefix):
    """A query over `prefix` keys gives the same bits alone and inside a tree whose blocks end off tile edges."""
    g = torch.Generator().manual_seed(prefix)
    heads, kv_heads, dim = 4, 2, 16
    n = prefix + 40
    k = torch.randn(n, kv_heads, dim, generator=g)
    v = torch.randn(n, kv_heads, dim, generator=g)
    q = torch.randn(n, heads, dim, generator=g)

    def run(block_len: list[int], parents: list[int], queries: np.ndarray, rows: int):
        starts = np.cumsum([0, *block_len[:-1]]).astype(np.int32)
        block_of = np.repeat(np.arange(len(block_len)), block_len).astype(np.int32)
        positions = np.concatenate(
            [
                np.arange(s, s + n_)
                for s, n_ in zip(
                    [0 if p < 0 else int(starts[p] + block_len[p]) for p in parents], block_len, strict=True
                )
            ]
        ).astype(np.int32)
        layout = K.to_torch(
            lay_out_attention(
                block_of,
                positions,
                starts,
                np.asarray(block_len),
                np.asarray(parents),
                np.full(len(block_len), -1),
                {},
                1,
                queries,
                rows,
            ),
            torch.device("cpu"),
        )
        zero = torch.zeros(1, kv_heads, dim)
        rows_of = torch.full((n,), -1, dtype=torch.int64)
        rows_of[torch.from_numpy(queries.astype(np.int64))] = torch.arange(len(queries))
        return K.tree_attention(q[queries], torch.cat([zero, k]), torch.cat([zero, v]), layout, rows_of)

    alone = run([prefix + 1], [-1], np.asarray([prefix]), K.QUERY_ROWS)[0]
    # the same tokens as root [0, prefix - 3) + child [prefix - 3, prefix + 1) + a sibling: query = last child token
    cut = max(1, prefix - 3)
    tree = run([cut, prefix + 1 - cut, n - prefix - 1], [-1, 0, 0], np.arange(n), K.QUERY_ROWS)
    assert _bits(tree[prefix]) == _bits(alone)
