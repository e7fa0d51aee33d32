"""The MLX backend: its Metal kernels' host side (argument packing, grids, shapes) checked without Metal by
emulating the kernels in numpy, and the backend serving requests over HTTP."""

from __future__ import annotations

import json
import random

import mlx.core as mx
import numpy as np
import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.backends.mlx import metal
from basal.backends.mlx import ops as O
from basal.backends.mlx.backend import MLXBackend
from basal.core.attention_plan import KEY_TILE, QUERY_ROWS, plan_attention
from basal.core.engine import Engine, Engines
from basal.core.gate import Gate
from basal.core.metrics import Metrics
from basal.core.pipeline import Pipeline


def emulate_attention(launch: metal.Launch, q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """What kernels/tree_attention.metal computes, thread by thread, in float64."""
    heads, kv_heads, dim, _width, n_q = launch.arrays["params"].tolist()
    assert launch.grid[0] >= n_q * heads and launch.grid[0] % launch.threadgroup[0] == 0
    out = np.zeros(launch.output_shape)
    for qi in range(n_q):
        chain = launch.arrays["key_idx"][launch.arrays["query_chunk"][qi]]
        pos = launch.arrays["query_pos"][qi]
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            s = np.array([q[qi, h] @ keys[chain[j], kvh] for j in range(pos + 1)]) / np.sqrt(dim)
            p = np.exp(s - s.max())
            out[qi, h] = (p[:, None] * values[chain[: pos + 1], kvh]).sum(0) / p.sum()
    return out


def _tree():
    """Root of 70 tokens (crosses a key tile), two children of 5 and 40 tokens."""
    lens, parents = np.array([70, 5, 40]), np.array([-1, 0, 0])
    starts = np.array([0, 70, 75])
    block_of = np.repeat(np.arange(3), lens)
    positions = np.concatenate([np.arange(70), np.arange(70, 75), np.arange(70, 110)])
    return block_of, positions, starts, lens, parents


@pytest.mark.parametrize("rows", [QUERY_ROWS, 1])
def test_attention_launch_packs_what_the_portable_path_computes(rows):
    rng = np.random.default_rng(0)
    block_of, positions, starts, lens, parents = _tree()
    n, heads, kv_heads, dim = len(block_of), 4, 2, 16
    queries = np.arange(n) if rows > 1 else np.array([74, 114])  # readouts: the last token of each child
    plan = plan_attention(block_of, positions, starts, lens, parents, np.full(3, -1), {}, 1, queries, rows)
    query_rows = np.full(n, -1)
    query_rows[queries] = np.arange(len(queries))
    q = rng.standard_normal((len(queries), heads, dim)).astype(np.float32)
    keys = np.concatenate([np.zeros((1, kv_heads, dim)), rng.standard_normal((n, kv_heads, dim))]).astype(np.float32)
    values = np.concatenate([np.zeros((1, kv_heads, dim)), rng.standard_normal((n, kv_heads, dim))]).astype(np.float32)
    launch = metal.attention_launch(plan, query_rows, len(queries), heads, kv_heads, dim)
    assert launch.output_shape == (len(queries), heads, dim) and launch.arrays["key_idx"].dtype == np.int32
    assert launch.arrays["key_idx"].shape[1] % KEY_TILE == 0
    emulated = emulate_attention(launch, q, keys, values)
    portable = np.array(O.tree_attention(mx.array(q), mx.array(keys), mx.array(values), plan, query_rows))
    np.testing.assert_allclose(portable, emulated, atol=2e-5)


def test_readout_launch_and_head_dim_limit():
    launch = metal.readout_launch(3, 10, 64)
    assert launch.output_shape == (3, 10) and launch.grid[0] >= 30 and launch.threadgroup == (64, 1, 1)
    block_of, positions, starts, lens, parents = _tree()
    plan = plan_attention(block_of, positions, starts, lens, parents, np.full(3, -1), {}, 1, np.arange(3), 1)
    with pytest.raises(ValueError, match="MAX_HEAD_DIM"):
        metal.attention_launch(plan, np.arange(len(block_of)), 3, 4, 2, 512)


def test_kernel_sources_are_there():
    for name in ("tree_attention", "letter_readout"):
        source = (metal.KERNELS / f"{name}.metal").read_text()
        assert "thread_position_in_grid" in source and "params" in source


@pytest.mark.skipif(mx.metal.is_available(), reason="on a Mac the kernels run (bench/mac_check.py)")
def test_metal_kernels_refuse_to_run_without_metal():
    with pytest.raises(RuntimeError, match="Metal"):
        metal.letter_readout(mx.zeros((2, 8)), mx.zeros((10, 8)))
    assert MLXBackend.devices() == ["cpu"]
    with pytest.raises(ValueError, match="not available"):
        MLXBackend.load(None, device="metal")


def test_mlx_backend_serves_over_http(demo_model):
    backend = MLXBackend.load(demo_model)
    metrics = Metrics()
    engine = Engine(demo_model.name, Pipeline(demo_model, backend), Gate(), metrics)
    engines = Engines({demo_model.name: engine}, demo_model.name, metrics)
    body = {
        "model": "jev-latest",
        "state": "Zamówienie dotarło uszkodzone.",
        "questions": {
            "r": {"type": "noul", "instructions": "Czy zwrot?"},
            "c": {
                "type": "choice",
                "criteria": {f"o{i}": f"opcja {i}" for i in range(random.Random(1).randint(2, 10))},
            },
        },
    }
    with TestClient(create_app(engines)) as c:
        r = c.post("/v1/systemone", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200 and set(r.json()["answers"]) == {"r", "c"}
    assert (backend.name, backend.device, backend.dtype) == ("mlx", "cpu", "f32")
