"""The MLX backend: its Metal kernels' host side (argument packing, grids, shapes) checked without Metal by
emulating the kernels in numpy, and the backend serving requests over HTTP."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.backends.mlx import metal
from basal.backends.mlx import ops as O
from basal.backends.mlx.backend import MLXBackend
from basal.backends.mlx.device_scope import on_device
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.packing.attention_layout import KEY_TILE, QUERY_ROWS, lay_out_attention
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import single_prompt_forward


def emulate_attention(launch: metal.Launch, q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """What kernels/tree_attention.metal computes, thread by thread, in float64."""
    heads, kv_heads, dim, _width, n_q, n_blocks = launch.arrays["params"][:6].tolist()
    template = dict(launch.template)
    qb, group = template["QB"], template["GROUP"]
    # a threadgroup per (block of queries, key/value head): a simdgroup per (query of the block, head of the group)
    assert group == heads // kv_heads and qb * group <= metal.ATTENTION_MAX_SIMDS
    assert launch.threadgroup[0] == qb * group * metal.SIMD_WIDTH
    assert launch.grid[0] == n_blocks * kv_heads * launch.threadgroup[0]
    assert template["STAGE"] * template["MAX_D"] <= metal.STAGE_FLOATS
    blocks = launch.arrays["group_queries"][: n_blocks * qb].reshape(n_blocks, qb)
    listed = np.sort(blocks[blocks >= 0])
    assert listed.tolist() == list(range(n_q))  # every query in exactly one block
    chunk_of = {int(r): int(launch.arrays["group_chunk"][b]) for b, rows in enumerate(blocks) for r in rows if r >= 0}
    out = np.zeros(launch.output_shape)
    for qi in range(n_q):
        chain = launch.arrays["key_idx"][chunk_of[qi]]
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
    layout = lay_out_attention(block_of, positions, starts, lens, parents, np.full(3, -1), {}, 1, queries, rows)
    query_rows = np.full(n, -1)
    query_rows[queries] = np.arange(len(queries))
    q = rng.standard_normal((len(queries), heads, dim)).astype(np.float32)
    keys = np.concatenate([np.zeros((1, kv_heads, dim)), rng.standard_normal((n, kv_heads, dim))]).astype(np.float32)
    values = np.concatenate([np.zeros((1, kv_heads, dim)), rng.standard_normal((n, kv_heads, dim))]).astype(np.float32)
    launch = metal.attention_launch(layout, query_rows, len(queries), heads, kv_heads, dim)
    assert dict(launch.template)["QB"] == (8 if rows > 1 else 1)  # 16 simdgroups of 2 heads; a readout layout: 1
    assert launch.output_shape == (len(queries), heads, dim) and launch.arrays["key_idx"].dtype == np.int32
    assert launch.arrays["key_idx"].shape[1] % KEY_TILE == 0
    emulated = emulate_attention(launch, q, keys, values)
    portable = np.array(O.tree_attention(mx.array(q), mx.array(keys), mx.array(values), layout, query_rows))
    np.testing.assert_allclose(portable, emulated, atol=2e-5)


def test_readout_launch_and_launch_checks():
    launch = metal.readout_launch(3, 10, 64)
    assert launch.output_shape == (3, 10) and launch.grid[0] >= 30 and launch.threadgroup == (64, 1, 1)
    assert launch.arrays["params"].size == metal.MIN_BUFFER  # 3 values, padded: never the constant address space
    block_of, positions, starts, lens, parents = _tree()
    layout = lay_out_attention(block_of, positions, starts, lens, parents, np.full(3, -1), {}, 1, np.arange(3), 1)
    rows = np.arange(len(block_of))
    with pytest.raises(ValueError, match="MAX_HEAD_DIM"):
        metal.attention_launch(layout, rows, 3, 4, 2, 512)
    with pytest.raises(ValueError, match="key/value heads"):
        metal.attention_launch(layout, rows, 3, 6, 4, 16)
    # a query the layout does not cover would read chunk 0's keys: refused before any launch
    with pytest.raises(ValueError, match="missing from the attention layout"):
        metal.attention_launch(layout, rows, 4, 4, 2, 16)
    launch = metal.attention_launch(layout, rows, 3, 4, 2, 16)
    assert all(a.size >= metal.MIN_BUFFER and a.dtype == np.int32 for a in launch.arrays.values())
    # one query per chunk in this layout: blocks of one query (no idle simdgroups), 2 heads per key/value head
    assert dict(launch.template) == {"KEY_TILE": KEY_TILE, "MAX_D": 32, "QB": 1, "GROUP": 2, "STAGE": 32}
    args = metal.AttentionArgs(launch)
    q16 = mx.zeros((3, 4, 16), dtype=mx.float16)
    kv = mx.zeros((len(block_of) + 1, 2, 16))
    with pytest.raises(TypeError, match="float32"):
        metal.attention_call(q16, kv, kv, args)
    with pytest.raises(ValueError, match="do not match"):
        metal.attention_call(mx.zeros((3, 4, 8)), kv, kv, args)
    with pytest.raises(TypeError, match="float32"):
        metal.readout_call(mx.zeros((2, 8), dtype=mx.bfloat16), mx.zeros((10, 8)))


def test_matmul_chunks_are_never_under_16_rows():
    assert O.MIN_CHUNK_ROWS == 16 and O.READOUT_ROWS >= O.MIN_CHUNK_ROWS
    with pytest.raises(ValueError, match="gemv"):
        O.linear(mx.zeros((3, 8)), mx.zeros((8, 8)), None, 8)


def test_kernel_sources_are_there():
    for name in ("tree_attention", "letter_readout"):
        source = (metal.KERNELS / f"{name}.metal").read_text()
        assert "_position_in_grid" in source and "params" in source  # MLX makes the attributes from these names


@pytest.mark.skipif(mx.metal.is_available(), reason="on a Mac the kernels run (bench/checks/mac_check.py)")
def test_metal_kernels_refuse_to_run_without_metal():
    with pytest.raises(RuntimeError, match="Metal"):
        metal.letter_readout(mx.zeros((2, 8)), mx.zeros((10, 8)))
    assert MLXBackend.devices() == ["cpu"]
    with pytest.raises(ValueError, match="not available"):
        MLXBackend.load(None, device="metal")


def test_default_device_is_metal_where_there_is_one(demo_model):
    backend = MLXBackend.load(demo_model)
    expected = ("metal", "f16") if mx.metal.is_available() else ("cpu", "f32")
    assert (backend.device, backend.dtype) == expected


def test_mlx_backend_serves_over_http(demo_model):
    backend = MLXBackend.load(demo_model, device="cpu")
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


def test_metal_native_ops_agree_with_the_portable_ones(demo_model):
    """The Metal path's norms and SwiGLU (`native.py`), run here on the CPU: same model, logits within f32 noise.
    (Their invariance is a Metal property; bench/checks/mac_check.py checks it there.)"""
    from basal.backends.mlx.model import MLXLlama
    from basal.core.packing.tree import single_prompt_forward

    tokens = demo_model.tokenizer.encode("Czy paczka dotarła uszkodzona? A. tak B. nie")
    batch = single_prompt_forward(tokens)
    letters = tuple(int(x) for x in batch.letter_ids) or (1, 2)
    net, results = MLXLlama(demo_model, "f32", use_metal=False, native_ops=False), []
    for native in (False, True):
        net.native = native
        results.append(run_to_end(net.forward(net.inputs(batch), batch.tokens, letters)))
    assert results[0].shape == results[1].shape
    np.testing.assert_allclose(results[1], results[0], atol=1e-4)


def test_long_pass_steps_aside_inside_a_layer_with_the_same_bits(demo_model, monkeypatch):
    """On the CPU, past STEP_ROWS rows a layer yields between row blocks and attention groups; the engine may
    pause at every yield, so another batch runs at each one here, and the bits must not change."""
    from basal.backends.mlx import model as mlx_model
    from basal.core.packing.tree import split_forwards
    from tests.determinism.harness import Harness

    h = Harness(demo_model, "mlx", "cpu", "f32")
    rng = random.Random(5)
    questions = [h.question(rng, "en", state_words=50) for _ in range(2)]
    interloper = [h.question(rng, "pl")]
    (forward,) = split_forwards(questions, h.cached.letter_ids, h.cached.prefixes)
    assert forward.packed.n_tokens > 2 * 64
    reference = run_to_end(h.backend.run(forward.packed))
    monkeypatch.setattr(mlx_model, "STEP_ROWS", 64)
    steps, yields, stepped = h.backend.run(forward.packed), 0, None
    while stepped is None:
        try:
            next(steps)
        except StopIteration as done:
            stepped = done.value
        else:
            yields += 1
            if yields % 3 == 1:  # another batch takes the device between two blocks of a layer
                run_to_end(h.cached.letter_logits(interloper))
    assert yields > 2 * demo_model.config.num_hidden_layers
    assert stepped.tobytes() == reference.tobytes()


def _default_stream() -> mx.Stream:
    return mx.default_stream(mx.default_device())


def test_each_step_runs_on_its_scope_and_no_pause_does():
    """A pass's steps run inside its scope; between them the engine's thread is back on its own default."""
    scope, outside = mx.new_stream(mx.cpu), _default_stream()

    def steps():
        seen = []
        for _ in range(3):
            seen.append(_default_stream())
            yield
        return seen

    wrapped, paused = on_device(scope, steps()), []
    while True:
        try:
            next(wrapped)
        except StopIteration as done:
            inside = done.value
            break
        paused.append(_default_stream())
    assert inside == [scope] * 3 and paused == [outside] * 3

    def entered_once(scope, steps):  # negative control: a `with` around the generator's body
        with mx.stream(scope):
            return (yield from steps)

    leaky = entered_once(scope, steps())
    next(leaky)
    assert _default_stream() == scope  # the engine's thread now runs on the backend's device
    leaky.close()


def test_backend_leaves_the_process_default_alone(demo_model, monkeypatch):
    """Two MLX models in one process (Metal and CPU) each compute on their own device: loading or running one
    never sets the process default, and every op of a pass is made inside the backend's scope."""

    def refuse(_device):
        raise AssertionError("a backend set the process default device")

    monkeypatch.setattr(mx, "set_default_device", refuse)
    backend = MLXBackend.load(demo_model, device="cpu")
    backend.scope = mx.new_stream(mx.cpu)  # a scope the test can tell from the default
    seen = []
    layer = backend.net.layer

    def spy(*args, **kwargs):
        seen.append(_default_stream())
        return (yield from layer(*args, **kwargs))

    monkeypatch.setattr(backend.net, "layer", spy)
    outside = _default_stream()
    batch = single_prompt_forward(demo_model.tokenizer.encode("Czy paczka dotarła uszkodzona? A. tak B. nie"))
    batch = replace(batch, letter_ids=np.array([1, 2], dtype=np.int32))
    logits = run_to_end(backend.run(batch))
    assert seen == [backend.scope] * demo_model.config.num_hidden_layers
    assert _default_stream() == outside
    backend.scope = mx.cpu  # the thread's default stream: the same bits
    assert run_to_end(backend.run(batch)).tobytes() == logits.tobytes()
