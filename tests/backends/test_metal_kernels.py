"""The Metal kernels' own logic, executed on this CPU: MLX's generated source for each call runs under a C++
stand-in for Metal (metal_emulation.py) and its output is compared bit for bit across packings — alone, batched
with strangers, in a tree with siblings, with the template prefix cached — at the awkward sizes (fewer than 8
queries, tile edges, GQA groups 6 / 8 / 4, chain depth 8, head dims off the simdgroup width), and against the
portable MLX path and the previous one-thread-per-query kernel. A kernel whose key tiles depend on the batch must
be caught by the same comparisons (negative control)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest

from basal.backends.mlx import metal
from basal.backends.mlx import ops as O
from basal.core.packing.attention_layout import QUERY_ROWS, lay_out_attention
from tests.backends import metal_emulation as E

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")

REFERENCE_KERNEL = E.STANDIN.parents[1] / "data" / "metal" / "tree_attention_thread_per_query.metal"


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    """Compiled kernels are cached here (and in-process) for the whole test session."""
    return tmp_path_factory.mktemp("metal_standin")


@dataclass
class Logical:
    """A forest of prompt blocks with their own q/k/v rows: the same tokens, however a batch packs them."""

    parent: list[int]
    length: list[int]
    q: list[np.ndarray]
    k: list[np.ndarray]
    v: list[np.ndarray]

    @classmethod
    def make(cls, parent: list[int], length: list[int], heads: int, kv_heads: int, dim: int, seed: int) -> Logical:
        rng = np.random.default_rng(seed)

        def rows(n: int, h: int) -> np.ndarray:
            return rng.standard_normal((n, h, dim)).astype(np.float32)

        return cls(
            parent,
            length,
            [rows(n, heads) for n in length],
            [rows(n, kv_heads) for n in length],
            [rows(n, kv_heads) for n in length],
        )

    def start(self, b: int) -> int:
        p = self.parent[b]
        return 0 if p < 0 else self.start(p) + self.length[p]


def pack(world: Logical, blocks: list[int], readouts: bool, cached_prefix: int = 0):
    """A batch of `blocks` (closed under parents) in this order; the first `cached_prefix` tokens of every root
    come from the prefix cache. Returns the launch inputs and, per output row, its (block, offset)."""
    index = {b: i for i, b in enumerate(blocks)}
    lens = [world.length[b] - (cached_prefix if world.parent[b] < 0 else 0) for b in blocks]
    starts = np.cumsum([0, *lens[:-1]])
    parents = np.asarray([index[world.parent[b]] if world.parent[b] >= 0 else -1 for b in blocks])
    block_of = np.repeat(np.arange(len(blocks)), lens)
    first = [cached_prefix if world.parent[b] < 0 else 0 for b in blocks]
    positions = np.concatenate(
        [world.start(b) + np.arange(f, world.length[b]) for b, f in zip(blocks, first, strict=True)]
    )
    roots = [b for b in blocks if world.parent[b] < 0]
    prefix_rows, offsets, row = [], {}, 1
    for j, b in enumerate(roots):
        offsets[j] = (row, cached_prefix)
        row += cached_prefix
        prefix_rows.append(b)
    root_prefix = np.asarray([roots.index(b) if world.parent[b] < 0 and cached_prefix else -1 for b in blocks])
    n = len(block_of)
    queries = np.asarray(starts + np.asarray(lens) - 1) if readouts else np.arange(n)  # readouts: last tokens
    layout = lay_out_attention(
        block_of,
        positions,
        starts,
        np.asarray(lens),
        parents,
        root_prefix,
        offsets,
        row,
        queries,
        1 if readouts else QUERY_ROWS,
    )
    query_rows = np.full(n, -1)
    query_rows[queries] = np.arange(len(queries))
    tokens = [(b, o) for b, f in zip(blocks, first, strict=True) for o in range(f, world.length[b])]
    kv_shape = world.k[0].shape[1:]
    keys = [np.zeros((1, *kv_shape), np.float32)] + [world.k[b][:cached_prefix] for b in prefix_rows]
    values = [np.zeros((1, *kv_shape), np.float32)] + [world.v[b][:cached_prefix] for b in prefix_rows]
    keys += [world.k[b][o][None] for b, o in tokens]
    values += [world.v[b][o][None] for b, o in tokens]
    q = np.stack([world.q[tokens[i][0]][tokens[i][1]] for i in queries])
    return layout, query_rows, q, np.concatenate(keys), np.concatenate(values), [tokens[i] for i in queries]


def attention_call(world: Logical, blocks: list[int], readouts: bool, cached_prefix: int = 0):
    layout, query_rows, q, keys, values, labels = pack(world, blocks, readouts, cached_prefix)
    heads, kv_heads, dim = q.shape[1], keys.shape[1], q.shape[2]
    args = metal.AttentionArgs(metal.attention_launch(layout, query_rows, len(q), heads, kv_heads, dim))
    call = metal.attention_call(mx.array(q), mx.array(keys), mx.array(values), args)
    return call, layout, query_rows, labels


def by_token(out: np.ndarray, labels) -> dict:
    return {lab: out[i].tobytes() for i, lab in enumerate(labels)}


# awkward shapes: GQA group 6 / 8 / 4, head dims on and off the simdgroup width, tile edges (63/64/65, 128/129)
SHAPES = [(12, 2, 32), (8, 1, 40), (8, 2, 16)]


def _world(shape, seed):
    heads, kv_heads, dim = shape
    # 0: root (64 tokens: its last query sits on a tile edge), 1..2: children of 0, 3: a stranger root,
    # 4..11: a chain of depth 8 under 1, whose blocks end at 65, 70, 127, 128, 129, ...
    parent = [-1, 0, 0, -1, 1, 4, 5, 6, 7, 8, 9, 10]
    length = [64, 1, 63, 20, 5, 57, 1, 1, 3, 2, 7, 1]
    return Logical.make(parent, length, heads, kv_heads, dim, seed)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[0]}-KVH{s[1]}-D{s[2]}")
def test_tree_attention_kernel_is_invariant_and_agrees_with_the_portable_path(shape, build_dir):
    world = _world(shape, seed=shape[0] + shape[2])
    chain = [0, 1, 4, 5, 6, 7, 8, 9, 10, 11]
    alone = {}
    for readouts in (False, True):
        call, layout, rows, labels = attention_call(world, chain, readouts)
        out = E.run(call, build_dir)
        portable = np.array(O.tree_attention(*call.inputs[:3], layout, rows))
        np.testing.assert_allclose(out, portable, rtol=1e-5, atol=2e-6)
        alone.update(by_token(out, labels))
    assert len(alone) > 100
    packings = [
        ([3, *chain, 2], False, 0),  # batched with a stranger in front and a sibling behind
        ([0, 2, 1, 4, 5, 6, 7, 8, 9, 10, 11, 3], True, 0),  # readouts only: a tree, fewer queries per chunk
        ([0, 1, 4, 5, 6, 7, 8, 9, 10, 11], True, 0),  # 10 readouts (chunks of one query)
        ([0, 1, 4, 5, 6, 7, 8, 9, 10, 11], False, 13),  # template prefix of 13 tokens from the cache
        ([0, 1, 4], True, 13),  # three readouts (< 8 queries: padded index arrays), cached prefix
    ]
    for blocks, readouts, cached in packings:
        call, _, _, labels = attention_call(world, blocks, readouts, cached)
        got = by_token(E.run(call, build_dir), labels)
        shared = [lab for lab in got if lab in alone]
        assert shared, blocks
        assert all(got[lab] == alone[lab] for lab in shared), (blocks, readouts, cached)


def thread_per_query_call(call: metal.KernelCall) -> metal.KernelCall:
    """The same attention as the old kernel's launch: one thread per (query, head), each query given its chunk."""
    arrays = call.launch.arrays
    n_q, heads, _ = call.launch.output_shape
    chunk_of = np.zeros(max(n_q, metal.MIN_BUFFER), dtype=np.int32)
    group_queries = arrays["group_queries"][: arrays["params"][5] * dict(call.launch.template)["QB"]]
    for block, rows in enumerate(group_queries.reshape(-1, dict(call.launch.template)["QB"])):
        chunk_of[rows[rows >= 0]] = arrays["group_chunk"][block]
    params = arrays["params"].copy()
    params[5] = 0
    names = ("q", "keys", "values", "key_idx", "query_chunk", "query_pos", "params")
    inputs = (*call.inputs[:4], mx.array(chunk_of), mx.array(arrays["query_pos"]), mx.array(params))
    grid = (-(-(n_q * heads) // 64) * 64, 1, 1)
    threads = metal.Launch({}, grid, (64, 1, 1), call.launch.output_shape, (("KEY_TILE", 64), ("MAX_D", 256)))
    return metal.KernelCall(call.name, names, inputs, threads)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[0]}-KVH{s[1]}-D{s[2]}")
def test_shared_tile_kernel_computes_what_one_thread_per_query_did(shape, build_dir):
    """The rewrite keeps the numerics: the same f32 operations in the same order, now spread over the lanes of a
    simdgroup, with the keys and values staged once per threadgroup for a block of queries and their heads."""
    world = _world(shape, seed=5)
    for blocks, readouts, cached in (([0, 2, 1, 4, 5, 6], False, 0), ([3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11], True, 13)):
        call, _, _, _ = attention_call(world, blocks, readouts, cached)
        old = E.run(thread_per_query_call(call), build_dir, body=REFERENCE_KERNEL.read_text())
        assert old.tobytes() == E.run(call, build_dir).tobytes()


def test_negative_control_batch_dependent_tiles_are_caught(build_dir):
    """Key tiles of 32 once a batch has more than 8 queries: alone (few readouts) and batched must now differ."""
    body = (metal.KERNELS / "tree_attention.metal").read_text()
    tile = "(NQ > 8 ? KEY_TILE / 2 : KEY_TILE)"
    variant = body.replace("t += KEY_TILE)", f"t += {tile})").replace("metal::min(KEY_TILE,", f"metal::min({tile},")
    assert variant != body
    world = _world((8, 2, 16), seed=9)
    few, _, _, few_labels = attention_call(world, [0, 1, 4, 5], readouts=True)
    many, _, _, many_labels = attention_call(world, [0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 2, 3], readouts=True)
    for body_text, expect_same in ((body, True), (variant, False)):
        a = by_token(E.run(few, build_dir, body=body_text), few_labels)
        b = by_token(E.run(many, build_dir, body=body_text), many_labels)
        shared = [lab for lab in a if lab in b and world.start(lab[0]) + lab[1] >= 64]  # > 1 tile of keys
        assert shared
        assert all(a[lab] == b[lab] for lab in shared) is expect_same


def test_generated_signature_has_one_address_space_for_every_batch():
    """Index arrays under 8 elements would go to `constant` memory and compile another kernel: they are padded."""
    world = _world((8, 2, 16), seed=1)
    signatures = set()
    for blocks in ([0], [0, 1], [0, 1, 4, 5, 6, 7, 8, 9, 10, 11]):
        call, _, _, _ = attention_call(world, blocks, readouts=True)
        source = E.generated_source(call)
        assert " constant " not in source.split(") {\n")[0]
        signatures.add(source.split(") {\n")[0])
    assert len(signatures) == 1


@pytest.mark.parametrize("n_readouts", [1, 3, 13])
def test_letter_readout_kernel_bits(n_readouts, build_dir):
    """Bit for bit the in-order f32 sum of products; row r's logits do not depend on how many rows there are."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((13, 72)).astype(np.float32)
    head = rng.standard_normal((7, 72)).astype(np.float32)
    out = E.run(metal.readout_call(mx.array(x[:n_readouts]), mx.array(head)), build_dir)
    expected = np.zeros((n_readouts, 7), np.float32)
    for d in range(72):
        expected = expected + x[:n_readouts, d, None] * head[None, :, d]
    assert out.tobytes() == expected.tobytes()
    full = E.run(metal.readout_call(mx.array(x), mx.array(head)), build_dir)
    assert out.tobytes() == full[:n_readouts].tobytes()
    np.testing.assert_allclose(out, np.array(O.linear(mx.array(x[:n_readouts]), mx.array(head).T, None, 16)), 1e-5)


def test_the_stand_in_runs_threadgroups_concurrently_at_barriers(build_dir):
    """Negative controls for the stand-in itself: without the barrier after staging, threads read keys the others
    have not written yet (the output changes); a barrier only some simdgroups reach aborts the run (a GPU hang)."""
    body = (metal.KERNELS / "tree_attention.metal").read_text()
    barrier = "        threadgroup_barrier(mem_flags::mem_threadgroup);\n"
    assert body.count(barrier) >= 2
    no_barrier = body.replace(barrier, "", 1)
    only_active = "        if (n > 0) {\n            threadgroup_barrier(mem_flags::mem_threadgroup);\n        }\n"
    divergent = body.replace(barrier, only_active, 1)
    world = _world((12, 2, 32), seed=4)
    call, _, _, _ = attention_call(world, [0, 1, 4, 5, 6, 7], readouts=False)  # queries of unequal positions
    right = E.run(call, build_dir)
    assert E.run(call, build_dir, body=no_barrier).tobytes() != right.tobytes()
    with pytest.raises(RuntimeError, match=r"can never all be met|finished while others wait"):
        E.run(call, build_dir, body=divergent)


def test_the_metal_model_path_runs_end_to_end_under_the_stand_in(demo_model, build_dir, monkeypatch):
    """MLXLlama's Metal branch on the CPU, both kernels under the stand-in: the template prefixes, attention
    launches built once per batch (not per layer), each layer submitted with mx.async_eval one in flight, the
    readout kernel. A question alone and in a tree with others gives the same bits, and agrees with the portable
    path within 1e-5. (Norms and SwiGLU stay portable here: the Metal-native ones are row-invariant on Metal only.)"""
    from basal.backends.mlx.backend import MLXBackend
    from basal.core.engine.pipeline import Pipeline
    from basal.core.packing.passes import run_to_end
    from tests.core.engine.test_prepared_forwards import questions

    counts = {"launch": 0, "tree_attention": 0, "letter_readout": 0}

    def run(call):
        counts[call.name] += 1
        return mx.array(E.run(call, build_dir))

    def launch(*args):
        counts["launch"] += 1
        return build(*args)

    build = metal.attention_launch
    monkeypatch.setattr(metal.KernelCall, "run", run)
    monkeypatch.setattr(metal, "attention_launch", launch)
    backend = MLXBackend.load(demo_model, device="cpu")
    backend.net.use_metal = True  # the Metal branch of the model, kernels under the stand-in
    pipeline = Pipeline(demo_model, backend)
    qs = questions(demo_model, 3)
    alone = run_to_end(pipeline.letter_logits(qs[:1]))
    counts.update(dict.fromkeys(counts, 0))
    forwards = pipeline.pack_questions(qs)
    together = run_to_end(pipeline.run_forwards(qs, forwards))
    layers = demo_model.config.num_hidden_layers
    assert counts == {"launch": 2 * len(forwards), "tree_attention": layers * len(forwards), "letter_readout": 1}
    assert [r.tobytes() for r in alone[0]] == [r.tobytes() for r in together[0]]
    portable = run_to_end(Pipeline(demo_model, MLXBackend.load(demo_model, device="cpu")).letter_logits(qs))
    for ours, theirs in zip(together, portable, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
