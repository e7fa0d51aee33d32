"""The tile GEMMs' used-rows probe (basal/backends/cuda/tile_rows.py): attention computed on a chunk's used rows
gives the bits of the full-row calls wherever the probe allows it, and the probe refuses a shape-dependent GEMM
(the negative control)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch

from basal.backends.cuda import ops as K
from basal.backends.cuda import tile_rows
from basal.backends.cuda.cpu import cpu_kernels
from tests.determinism.test_attention_equality import CASES, CPU, _tree_case


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_used_rows_give_the_bits_of_full_rows(case, compiled, monkeypatch):
    block_len, parents = CASES[case]
    q, k, v, layout, rows_of = _tree_case(case, block_len, parents, K.QUERY_ROWS)
    groups = K.to_torch(layout, CPU)
    with nullcontext() if compiled else cpu_kernels.suspended():
        trimmed = K.tree_attention(q, k, v, groups, rows_of)
        monkeypatch.setattr(tile_rows, "invariant_rows", lambda *a: frozenset())
        full = K.tree_attention(q, k, v, groups, rows_of)
    assert np.array_equal(_bits(trimmed), _bits(full))


def test_the_cases_run_trimmed_groups():
    """The comparison above is not vacuous: most cases have chunks whose used rows the probe lets run alone."""
    allowed = tile_rows.invariant_rows(2, 16, 2, K.QUERY_ROWS, K.KEY_TILE, "cpu", torch.get_num_threads())
    trimmed = 0
    for case, (block_len, parents) in enumerate(CASES):
        _, _, _, layout, _ = _tree_case(case, block_len, parents, K.QUERY_ROWS)
        trimmed += any(g.rows_used < K.QUERY_ROWS and g.rows_used in allowed for g in K.to_torch(layout, CPU))
    assert trimmed >= 3


def test_the_probe_refuses_a_shape_dependent_gemm():
    def shape_dependent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(a, b)
        return out if a.shape[-2] == 2 * K.QUERY_ROWS else out * (1 + 2**-20)  # only full-row calls are exact

    ok = tile_rows._probe(2, 16, 2, K.QUERY_ROWS, K.KEY_TILE, CPU, shape_dependent)
    assert ok == {K.QUERY_ROWS}
    honest = tile_rows._probe(2, 16, 2, K.QUERY_ROWS, K.KEY_TILE, CPU, torch.matmul)
    assert len(honest) > 1


def test_describe_says_what_runs(demo_model):
    line = tile_rows.describe(demo_model.config, "cpu")
    assert line.startswith(("used rows", "full 64-row"))


def test_the_probe_is_kept_on_disk_per_machine(monkeypatch, tmp_path):
    """A second process reads the probe's result instead of probing; another machine key, or "off", probes."""
    monkeypatch.setenv("BASAL_GEMM_CACHE", str(tmp_path / "chunks.json"))
    monkeypatch.setenv("BASAL_HOME", str(tmp_path))
    calls = []
    probed = {1, 2, 5, K.QUERY_ROWS}  # what the probe found (its own checks are the tests above)
    monkeypatch.setattr(tile_rows, "_probe", lambda *a: calls.append(a[:3]) or set(probed))
    args = (2, 16, 2, K.QUERY_ROWS, K.KEY_TILE, "cpu", 1)

    def fresh():  # a new process: the in-memory cache is empty
        tile_rows.invariant_rows.cache_clear()
        return tile_rows.invariant_rows(*args)

    first = fresh()
    assert first == probed and len(calls) == 1 and (tmp_path / "tile_rows.json").is_file()
    assert fresh() == first and len(calls) == 1  # read from disk
    monkeypatch.setattr(tile_rows, "machine_key", lambda: "another CPU")
    assert fresh() == first and len(calls) == 2  # another machine: probed
    monkeypatch.setenv("BASAL_GEMM_CACHE", "off")
    fresh()
    assert len(calls) == 3
    tile_rows.invariant_rows.cache_clear()
