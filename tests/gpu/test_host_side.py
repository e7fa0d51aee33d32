"""The GPU path's host side, in plain Python (runs everywhere, no Triton): buckets, the tile tiling and its blob,
staging slots, the graph policy and the GEMM table (docs/gpu-path.md §8.1 c)."""

from __future__ import annotations

import functools
import itertools
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from basal.backends.cuda.gpu import gemm_table as gt
from basal.backends.cuda.gpu.buckets import (
    READOUT_BUCKETS,
    TOKEN_BUCKETS,
    layout_for,
    long_lane_chunks,
    probed_row_counts,
    readout_bucket,
    token_bucket,
)
from basal.backends.cuda.gpu.graphs import GraphCache
from basal.backends.cuda.gpu.kernel_configs import ATTENTION
from basal.backends.cuda.gpu.readback import ONE_OFF, StagingSlots, numpy_buffers
from basal.core import home
from basal.core.packing.tile_layout import NO_RANGE, BlobLayout, lay_out_tiles, pack_blob, tile_capacity, unpack_blob
from basal.core.packing.tree import (
    FORWARD_MAX_TOKENS,
    MAX_DEPTH,
    TREE_MAX_TOKENS,
    PackedForward,
    TokenizedQuestion,
    pack_row,
    split_forwards,
)


def test_token_buckets():
    assert all(b % 16 == 0 for b in TOKEN_BUCKETS)
    assert all(b2 <= 1.5 * b1 for b1, b2 in itertools.pairwise(TOKEN_BUCKETS))
    assert [token_bucket(n) for n in (1, 32, 33, 114, 180, 8192)] == [32, 32, 48, 128, 192, 8192]
    assert token_bucket(8193) == 9216 and token_bucket(20000) == 20480
    assert [readout_bucket(r) for r in (1, 2, 4, 5, 1024, 1025)] == [4, 4, 4, 16, 1024, 2048]
    with pytest.raises(ValueError):
        token_bucket(0)


def test_every_long_lane_chunk_is_a_probed_row_count():
    probed = set(probed_row_counts())
    assert set(TOKEN_BUCKETS) | set(READOUT_BUCKETS) <= probed
    for rows in (9216, 16384, 20480, 31744):
        chunks = long_lane_chunks(rows)
        assert sum(chunks) == rows and set(chunks) <= probed


def _batch():
    q = TokenizedQuestion("en", "s", ((1, 2, 3, 4, 5, 6), (1, 2, 3, 9, 8), (1, 2, 7)))
    r = TokenizedQuestion("pl", "t", ((5, 5, 5, 1), (5, 5, 6)))
    (forward,) = split_forwards([q, r], [40, 41], {"en": (1, 2), "pl": (5,)})
    return forward.packed


def test_tile_layout_covers_every_token_once_without_mixing_blocks():
    batch = _batch()
    tiling = lay_out_tiles(batch, {"en": (0, 2), "pl": (2, 1)}, tokens_per_tile=2)
    covered = []
    for q0, nq, pos0, block in tiling.tiles:
        assert 1 <= nq <= 2 and batch.positions[q0] == pos0
        assert all(batch.block_of[q0 + i] == block and batch.positions[q0 + i] == pos0 + i for i in range(nq))
        covered += range(q0, q0 + nq)
    assert sorted(covered) == list(range(batch.n_tokens))
    assert [tuple(t) for t in tiling.readout_tiles[:, :2]] == [(int(r), 1) for r in batch.readouts]


def test_chain_ranges_map_every_position_to_its_key_row():
    batch = _batch()
    prefix_rows = {"en": (0, 2), "pl": (2, 1)}
    tiling = lay_out_tiles(batch, prefix_rows, tokens_per_tile=4)
    for b in range(len(batch.block_start)):
        chain = batch.chain(b)
        expected = []  # (buffer, row) of positions 0 .. end of block b
        key = batch.prefix_keys[batch.block_prefix[chain[0]]]
        expected += [(0, prefix_rows[key][0] + i) for i in range(prefix_rows[key][1])]
        for c in chain:
            expected += [(1, batch.block_start[c] + i) for i in range(batch.block_len[c])]
        ranges = tiling.ranges[b]
        used = ranges[ranges[:, 0] != NO_RANGE, 0]
        assert len(used) == len(chain) + 1 and np.all(np.diff(used) > 0)  # the prefix range, then the chain
        for kp, want in enumerate(expected):
            r = max(i for i in range(len(ranges)) if ranges[i, 0] <= kp)
            assert (ranges[r, 1], ranges[r, 2] + kp - ranges[r, 0]) == want


def test_blob_round_trip_and_no_stale_fields():
    batch = _batch()
    tiling = lay_out_tiles(batch, {"en": (0, 2), "pl": (2, 1)}, tokens_per_tile=3)
    layout = BlobLayout(32, 16, tile_capacity(32, 16, 3))
    blob = np.full(layout.size, 77, dtype=np.int32)
    pack_blob(batch, tiling, layout, blob)
    back = unpack_blob(blob, layout)
    assert np.array_equal(back["tokens"], batch.tokens) and np.array_equal(back["positions"], batch.positions)
    assert np.array_equal(back["tiles"], tiling.tiles) and np.array_equal(back["readouts"], batch.readouts)
    assert np.array_equal(back["ranges"][: len(tiling.ranges)], tiling.ranges)
    assert np.all(back["ranges"][len(tiling.ranges) :] == 0) and 77 not in blob
    with pytest.raises(ValueError, match="does not fit"):
        pack_blob(batch, tiling, BlobLayout(16, 4, 100))


# ---------------------------------------------------------------------------------------------------------------
# The tile capacity: the attention grid is ceil(T_b/NT) + min(T_b, 2·R_b) programs per KV head


def _block_counts(batch: PackedForward) -> tuple[np.ndarray, np.ndarray]:
    """Per block: its number of children, and whether it ends a prompt (a readout is its last token)."""
    n_blocks = len(batch.block_start)
    children = np.bincount(batch.block_parent[batch.block_parent >= 0], minlength=n_blocks)
    ends = np.isin(batch.block_start + batch.block_len - 1, batch.readouts)
    return children, ends


LANGS = {"en": (7, 8), "pl": (6,), "de": ()}  # the template prefix cached per language; de has none


@st.composite
def question_sets(draw) -> list[TokenizedQuestion]:
    """Questions over a 3-token alphabet: shared prefixes, duplicates, prompts that are prefixes of others, ladders
    that nest past MAX_DEPTH, evidence rows (inside the cached prefix too), three languages, few states."""
    seen: dict[str, list[tuple[int, ...]]] = {lang: [] for lang in LANGS}
    questions = []
    for _ in range(draw(st.integers(1, 14))):
        lang = draw(st.sampled_from(sorted(LANGS)))
        prefix, orders = LANGS[lang], []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["fresh", "copy", "cut", "extend"] if seen[lang] else ["fresh"]))
            if kind == "fresh":
                body = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=10)))
            else:
                body = draw(st.sampled_from(seen[lang]))[len(prefix) :]
                if kind == "cut":
                    body = body[: draw(st.integers(1, len(body)))]
                elif kind == "extend":
                    body += tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
            orders.append(prefix + body)
            seen[lang].append(prefix + body)
        last = len(orders[0]) - 1  # prompt 0's readout: never a hidden row
        hidden = tuple(sorted(draw(st.sets(st.integers(0, last - 1), max_size=3)))) if last > 0 else ()
        questions.append(TokenizedQuestion(lang, draw(st.sampled_from("abc")), tuple(orders), hidden))
    lang = draw(st.sampled_from(sorted(LANGS)))
    for k in range(draw(st.sampled_from([0, 0, 6, 10, 13]))):  # a ladder of questions `1^k 2`, `1^k 3`: k deep
        questions.append(TokenizedQuestion(lang, "d", tuple(LANGS[lang] + (1,) * k + (t,) for t in (2, 3))))
    return questions


LADDER = [TokenizedQuestion("en", "s", ((7, 8, *[1] * k, 2), (7, 8, *[1] * k, 3))) for k in range(12)]


@settings(max_examples=400, deadline=None)
@given(
    question_sets(),
    st.sampled_from([16, 48, TREE_MAX_TOKENS]),
    st.sampled_from([24, 96, FORWARD_MAX_TOKENS]),
    st.booleans(),
)
@example(LADDER, TREE_MAX_TOKENS, FORWARD_MAX_TOKENS, True)  # the depth limit splits at depth 8
def test_the_packer_makes_at_most_two_blocks_per_readout(questions, tree_max, forward_max, share):
    """Every block ends a prompt or has two children or more, so a trie of R readouts has B <= 2R − 1 blocks; the
    readout bucket of a packed batch therefore never steps up for the tile capacity, and its blob always packs."""
    forwards = split_forwards(questions, [40, 41], LANGS, tree_max, forward_max, share_across_questions=share)
    if len(forwards) > 1:
        event("several forwards")
    for f in forwards:
        b = f.packed
        children, ends = _block_counts(b)
        assert np.all(ends | (children >= 2))
        assert set(b.readouts.tolist()) <= set((b.block_start + b.block_len - 1).tolist())  # a readout ends a block
        roots = int(np.sum(b.block_parent < 0))
        assert len(b.block_start) <= 2 * len(b.readouts) - roots
        siblings = [(int(p), int(b.tokens[s])) for p, s in zip(b.block_parent, b.block_start, strict=True) if p >= 0]
        for name, seen in {
            "the depth limit split a group": len(set(siblings)) < len(siblings),  # siblings on the same token
            "identical prompts share a readout": len(set(f.readout_of.values())) < len(f.readout_of),
            "a prompt is a prefix of another": bool(np.any(ends & (children > 0))),
            "evidence rows": len(b.hidden) > 0,
            "a cached template prefix": bool(np.any(b.block_prefix >= 0)),
            "several roots": roots > 1,
        }.items():
            if seen:
                event(name)
        for batch in (b, b.with_hidden_as_readouts()):
            r = len(batch.readouts)
            layout = layout_for(batch.n_tokens, r, len(batch.block_start), 10)
            assert layout.readout_bucket == readout_bucket(r)
            rows = {k: (0, len(LANGS[k])) for k in batch.prefix_keys}
            pack_blob(batch, lay_out_tiles(batch, rows, 10), layout)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=14).map(tuple), min_size=1, max_size=24),
    st.integers(1, MAX_DEPTH),
)
def test_a_trie_row_at_any_depth_limit_has_at_most_two_blocks_per_prompt(prompts, max_depth):
    """`pack_row` directly (split_forwards always packs at MAX_DEPTH): B <= 2·prompts − roots at every limit."""
    unique = list(dict.fromkeys(prompts))
    row = pack_row(unique, max_depth=max_depth)
    parents = np.asarray([p for _, _, p in row.blocks])
    children = np.bincount(parents[parents >= 0], minlength=len(parents))
    ends = np.isin([s + n - 1 for s, n, _ in row.blocks], list(row.ends.values()))
    assert np.all(ends | (children >= 2))
    assert len(row.blocks) <= 2 * len(unique) - int(np.sum(parents < 0))
    siblings = [(p, row.tokens[s]) for s, _, p in row.blocks]
    if len(set(siblings)) < len(siblings):
        event("the depth limit split a group")


def _old_capacity(token_bucket: int, tokens_per_tile: int) -> int:
    return -(-token_bucket // tokens_per_tile) + token_bucket  # one tile per token beyond the full ones


def test_the_tile_capacity_counts_two_blocks_per_readout_not_one_per_token():
    """The grid of the shipped attention config (64 query rows per tile: NT = 10, 8 and 16 tokens for the GQA
    groups 6, 8 and 4 of mini, 4.5B and max) at a single decision and at the largest buckets."""
    nt = {size: ATTENTION["f32"].tokens_per_tile(g) for size, g in (("mini", 6), ("4.5B", 8), ("max", 4))}
    assert nt == {"mini": 10, "4.5B": 8, "max": 16} and ATTENTION["f16"].bm == ATTENTION["f32"].bm
    buckets = [(128, 4), (512, 16), (2048, 64), (8192, 64), (8192, 1024)]
    assert [tile_capacity(t, r, nt["mini"]) for t, r in buckets] == [21, 84, 333, 948, 2868]
    assert [_old_capacity(t, nt["mini"]) for t, _ in buckets] == [141, 564, 2253, 9012, 9012]
    assert [tile_capacity(t, r, nt["max"]) for t, r in buckets] == [16, 64, 256, 640, 2560]
    assert [_old_capacity(t, nt["max"]) for t, _ in buckets] == [136, 544, 2176, 8704, 8704]
    assert tile_capacity(32, 1024, 10) == 4 + 32  # never more blocks than tokens

    # a single decision as gpu_check times it: 66 cached template tokens, a 100-token state, two 6-token orders
    rng = random.Random(0)
    prefix, state = tuple(rng.randrange(500) for _ in range(66)), tuple(rng.randrange(500) for _ in range(100))
    orders = tuple(prefix + state + tuple(rng.randrange(500) for _ in range(6)) for _ in range(2))
    (forward,) = split_forwards([TokenizedQuestion("en", "s", orders)], [40, 41], {"en": prefix})
    b = forward.packed
    layout = layout_for(b.n_tokens, len(b.readouts), len(b.block_start), nt["mini"])
    tiling = lay_out_tiles(b, {"en": (0, 66)}, nt["mini"])
    assert (b.n_tokens, len(b.block_start), len(tiling.tiles)) == (112, 3, 12)
    assert (layout.token_bucket, layout.readout_bucket, layout.tile_cap) == (128, 4, 21)  # was 141
    pack_blob(b, tiling, layout)


def _hand_built(rng: np.random.Generator, n_blocks: int, max_len: int, n_readouts: int) -> PackedForward:
    """A batch no packer made: random parents (chains <= MAX_DEPTH), any block lengths, few readouts."""
    lens = rng.integers(1, max_len + 1, n_blocks)
    parents, depth, pos0 = [], [], []
    for b in range(n_blocks):
        p = int(rng.integers(-1, b)) if b else -1
        if p >= 0 and depth[p] + 1 >= MAX_DEPTH:
            p = -1
        parents.append(p)
        depth.append(0 if p < 0 else depth[p] + 1)
        pos0.append(0 if p < 0 else pos0[p] + int(lens[p]))
    n = int(lens.sum())

    def i32(x):
        return np.asarray(x, dtype=np.int32)

    return PackedForward(
        tokens=i32(rng.integers(0, 100, n)),
        positions=i32(np.concatenate([np.arange(p, p + n_) for p, n_ in zip(pos0, lens, strict=True)])),
        block_of=i32(np.repeat(np.arange(n_blocks), lens)),
        block_start=i32(np.concatenate([[0], np.cumsum(lens)[:-1]])),
        block_len=i32(lens),
        block_parent=i32(parents),
        block_prefix=i32([-1] * n_blocks),
        prefix_keys=(),
        readouts=i32(np.sort(rng.choice(n, min(n, n_readouts), replace=False))),
        letter_ids=i32([40, 41]),
    )


def _preparer(tokens_per_tile: int):
    """`GpuBackend.prepare` on a backend without a model: only its planning (`_layout`, lay_out_tiles, pack_blob)."""
    pytest.importorskip("triton")  # the GPU backend module imports Triton's kernels
    from basal.backends.cuda.gpu.backend import GpuBackend

    net = SimpleNamespace(
        prefix_rows={}, tokens_per_tile=tokens_per_tile, cfg=SimpleNamespace(max_position_embeddings=8192)
    )
    be = SimpleNamespace(net=net, _prefix_version=0)
    be._layout = functools.partial(GpuBackend._layout, be)
    be._plan = functools.partial(GpuBackend._plan, be)
    return functools.partial(GpuBackend.prepare, be)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 700),
    st.sampled_from([1, 2, 9, 10, 11, 40]),
    st.integers(1, 4),
    st.sampled_from([1, 3, 10, 16]),
    st.sampled_from([0, 100, 3000]),
)
def test_any_batch_packs_through_prepare(seed, n_blocks, max_len, n_readouts, tokens_per_tile, pad_to):
    """Σ_b ceil(len_b/NT) <= ceil(n/NT) + B <= the layout's tile capacity for any batch, packed or not: the
    readout bucket steps up to ceil(B/2) when a batch has more blocks than two per readout."""
    batch = _hand_built(np.random.default_rng(seed), n_blocks, max_len, n_readouts)
    prepared = _preparer(tokens_per_tile)(batch, pad_to)  # never raises
    layout, n, blocks = prepared.layout, batch.n_tokens, len(batch.block_start)
    tiles = int(np.sum(-(-batch.block_len // tokens_per_tile)))
    assert unpack_blob(prepared.blob, layout)["tiles"].shape == (tiles, 4)
    assert tiles <= -(-n // tokens_per_tile) + blocks <= layout.tile_cap
    assert layout.readout_bucket == readout_bucket(max(len(batch.readouts), -(-blocks // 2)))


def test_a_batch_of_many_blocks_and_few_readouts_gets_a_larger_readout_bucket():
    """600 one-token blocks, one readout: at R_b = 4 the capacity would be ceil(640/10) + 8 = 72 tiles for 600."""
    batch = _hand_built(np.random.default_rng(1), 600, 1, 1)
    assert (batch.n_tokens, len(batch.readouts)) == (600, 1)
    with pytest.raises(ValueError, match="600 tiles does not fit"):
        pack_blob(batch, lay_out_tiles(batch, {}, 10), BlobLayout(640, 4, tile_capacity(640, 4, 10)))
    prepared = _preparer(10)(batch)
    assert (prepared.layout.token_bucket, prepared.layout.readout_bucket) == (640, 1024)  # ceil(600/2) -> 1024
    assert prepared.layout.tile_cap == 64 + 640 >= 600


class FakeEvent:
    def __init__(self):
        self.done = False

    def record(self, stream=None):
        self.done = False

    def query(self):
        return self.done


def test_staging_slots_rotate_and_wait_for_their_event():
    events = []

    def make_event():
        events.append(FakeEvent())
        return events[-1]

    slots = StagingSlots(lambda n: numpy_buffers(n, 4), make_event, n=2)
    a, b = slots.acquire(100), slots.acquire(100)
    assert a.index != b.index
    extra = slots.acquire(100)  # both in flight: a one-off slot, never a wait
    assert extra.index == ONE_OFF and extra not in slots.slots
    a.event.record()
    with pytest.raises(RuntimeError, match="before its copy"):
        slots.release(a)
    a.event.done = True
    slots.release(a)
    assert slots.acquire(50) is a
    big = slots.acquire(200)  # too big while slots are out (a paused pass may hold one): its own slot
    assert big.index == ONE_OFF and len(big.blob) == 200 and slots.blob_size == 100
    b.event.done = True
    slots.release(b)
    a.event.done = True
    slots.release(a)
    grown = slots.acquire(200)  # every slot is back: the ring grows
    assert grown.index != ONE_OFF and len(grown.blob) == 200 and slots.blob_size == 200


def test_graphs_are_captured_on_the_second_use_and_evicted_lru():
    cache = GraphCache(max_graphs=2)
    assert cache.step("a") == "eager" and cache.step("a") == "capture"
    cache.add("a", "graph-a")
    assert cache.step("a") == "replay"
    for key in ("b", "c"):
        cache.step(key)
        cache.step(key)
        cache.add(key, key)
    assert "a" not in cache.graphs and cache.step("a") == "eager"  # evicted, starts over


def _table(gemm_ms):
    cands = {n: gt.Candidate(ok, ms) for n, (ok, ms) in gemm_ms.items()}
    return gt.GemmTable({"gpu": "H200", "dtype": "f16"}, [32, 64], [gt.ShapeEntry(64, 128, gt.choose(cands), cands)])


def test_gemm_choice():
    assert gt.choose({"lt": gt.Candidate(True, 0.02), "tri": gt.Candidate(True, 0.03)}) == "lt"
    assert gt.choose({"lt": gt.Candidate(True, 0.05), "tri": gt.Candidate(True, 0.03)}) == "tri"
    assert gt.choose({"lt": gt.Candidate(False, None), "tri": gt.Candidate(True, None)}) == "tri"
    with pytest.raises(RuntimeError, match="no GEMM"):
        gt.choose({"lt": gt.Candidate(False), "tri": gt.Candidate(False)})


def test_gemm_table_round_trip_and_staleness(tmp_path):
    table = _table({"lt": (True, 0.02), "tri": (True, 0.03)})
    path = tmp_path / "gemm_table-f16.json"
    table.save(path)
    loaded, why = gt.load_table(path, {"gpu": "H200", "dtype": "f16"})
    assert why == "current" and loaded.gemm(64, 128) == "lt" and loaded.to_json() == table.to_json()
    stale, why = gt.load_table(path, {"gpu": "H200", "dtype": "f16", "driver": "590.1"})
    assert stale is None and why.startswith("stale: driver")
    assert gt.load_table(tmp_path / "none.json", {})[0] is None
    with pytest.raises(KeyError, match="not probed"):
        loaded.gemm(1, 2)
    assert "-> lt" in "\n".join(gt.describe(loaded, why))
    assert gt.table_key({"gpu": "x"}, "bf16") == {"gpu": "x", "dtype": "bf16"}


def test_warm_up_buckets_are_real_buckets_and_fit_the_graph_cache():
    from basal.backends.cuda.gpu.buckets import warm_buckets
    from basal.backends.cuda.gpu.graphs import MAX_GRAPHS

    pairs = warm_buckets()
    assert len(pairs) == 37 <= MAX_GRAPHS  # the LRU never evicts a warmed graph before a request uses it
    assert all(token_bucket(t) == t and readout_bucket(r) == r and r * 8 <= t for t, r in pairs)
    assert (32, 4) in pairs and (2048, 64) in pairs and (64, 16) not in pairs


def test_gemm_table_keeps_the_fused_epilogues():
    table = _table({"tri": (True, 0.03)})
    table.shapes[0].fused, table.shapes[0].fused_detail = "swiglu", "4 row counts x 3 anchors equal"
    loaded = gt.GemmTable.from_json(table.to_json())
    assert loaded.fused(64, 128) == "swiglu" and loaded.fused(1, 2) == ""
    assert "fused swiglu" in "\n".join(gt.describe(loaded, "current"))
    old = json.loads(table.to_json())
    for s in old["shapes"]:
        del s["fused"], s["fused_detail"]
    assert gt.GemmTable.from_json(json.dumps(old)).fused(64, 128) == ""  # a table from before: nothing fused


def test_the_library_gemm_adds_a_bias():
    """`lt` with a bias is `addmm`: cuBLASLt's bias epilogue on a GPU, the CPU's GEMM here."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(8, 32, generator=g), torch.randn(16, 32, generator=g), torch.randn(16, generator=g)
    out = gt.lt_linear(x, w, torch.empty(8, 16), b)
    assert torch.allclose(out, torch.nn.functional.linear(x, w, b), atol=1e-5)
    assert not torch.allclose(out, gt.lt_linear(x, w, torch.empty(8, 16)), atol=1e-3)


def test_the_probe_passes_the_bias_and_times_gemms_only_where_it_has_a_choice(monkeypatch):
    import torch

    seen = []

    def by_rows(x, w, out, bias=None):  # one row at a time: invariant over M by construction
        seen.append(bias is not None)
        for i in range(x.shape[0]):
            out[i] = x[i] @ w.T + (0 if bias is None else bias)
        return out

    monkeypatch.setitem(gt.GEMMS, "lt", by_rows)
    monkeypatch.setitem(gt.GEMMS, "tri", by_rows)
    cpu = torch.device("cpu")
    one = gt.probe([(16, 32)], torch.float32, cpu, [4, 16], {}, ("tri",), timing_rows=8, bias=True)
    assert one.shapes[0].bias and all(seen) and one.shapes[0].candidates["tri"].ms is None
    two = gt.probe([(16, 32)], torch.float32, cpu, [4, 16], {}, ("lt", "tri"), timing_rows=8)
    assert all(c.ms is not None for c in two.shapes[0].candidates.values()) and not two.shapes[0].bias


def test_the_probe_catches_bits_that_depend_on_a_rows_place_in_its_tile(monkeypatch):
    """A library kernel whose rows at offsets 3, 11, 19, ... of a batch take another path: the same at every M (the
    rows keep their offsets), so only moving the rows shows it. The old anchors (rows 0, M/2, M-1) missed it."""
    import torch

    def by_place(x, w, out, bias=None):
        out[:] = x @ w.T
        out[3::8] += 1e-3  # the fourth row of every 8-row tile
        return out

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(32, 16, generator=g), torch.randn(8, 16, generator=g)
    assert gt.probe_gemm(lambda x, w, out, bias=None: torch.mm(x, w.T, out=out), x, w, [4, 16, 32])[0]
    ok, detail = gt.probe_gemm(by_place, x, w, [4, 16, 32])
    assert not ok and "moved" in detail


def test_an_gemm_that_raises_is_ruled_out_not_fatal(monkeypatch, caplog):
    """Under the R7 settings a library may refuse a shape (torch raises where cuBLASLt has no split-K-free kernel):
    the shape takes the other GEMM, and the start goes on."""
    import torch

    def refuses(x, w, out, bias=None):
        raise RuntimeError("allow_splitk=False requires the cuBLASLt backend")

    monkeypatch.setitem(gt.GEMMS, "lt", refuses)
    monkeypatch.setitem(gt.GEMMS, "tri", lambda x, w, out, bias=None: torch.mm(x, w.T, out=out))
    table = gt.probe([(16, 32)], torch.float32, torch.device("cpu"), [4, 16], {}, ("lt", "tri"), timing_rows=8)
    (entry,) = table.shapes
    assert entry.gemm == "tri" and not entry.candidates["lt"].invariant
    assert "raised RuntimeError: allow_splitk=False" in entry.candidates["lt"].detail and "probe failed" in caplog.text


def test_an_gemm_table_that_cannot_be_saved_does_not_stop_a_start(tmp_path, caplog):
    pytest.importorskip("triton")  # the GPU backend module imports Triton's kernels
    from basal.backends.cuda.gpu.backend import keep_table

    table = gt.GemmTable({"gpu": "H200"}, [4], [gt.ShapeEntry(16, 32, "tri")])
    assert keep_table(table, tmp_path / "gpu" / "t.json") and (tmp_path / "gpu" / "t.json").is_file()
    (tmp_path / "file").write_text("")
    assert not keep_table(table, tmp_path / "file" / "gpu" / "t.json")  # its parent is a file: OSError
    assert "not saved" in caplog.text


@pytest.fixture
def cublas_flags(monkeypatch):
    """R7's process-wide flags and variables, put back after the test (they change nothing on the CPU)."""
    import torch

    from basal.backends.cuda.gpu.environment import CUBLAS_ENV

    for name in CUBLAS_ENV:
        monkeypatch.setenv(name, "unset by the test")
    matmul = torch.backends.cuda.matmul
    saved = {
        "allow_tf32": matmul.allow_tf32,
        "allow_fp16_reduced_precision_reduction": torch._C._get_cublas_allow_fp16_reduced_precision_reduction(),
        "allow_bf16_reduced_precision_reduction": torch._C._get_cublas_allow_bf16_reduced_precision_reduction(),
        "allow_fp16_accumulation": matmul.allow_fp16_accumulation,
    }
    for name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        setattr(matmul, name, (True, True))  # torch's defaults: what R7 must turn off
    yield matmul
    for name, value in saved.items():
        setattr(matmul, name, value)


def test_the_invariant_settings_are_read_back_split_k_included(cublas_flags):
    from basal.backends.cuda.gpu.environment import CUBLAS_ENV, SETTINGS_WANTED, apply_invariant_settings

    read = apply_invariant_settings()
    assert {k: read[k] for k in SETTINGS_WANTED} == SETTINGS_WANTED
    assert {k: read[k] for k in CUBLAS_ENV} == CUBLAS_ENV
    cublas_flags.allow_fp16_reduced_precision_reduction = False  # torch's plain False: split-K stays allowed
    assert cublas_flags.allow_fp16_reduced_precision_reduction_split_k


def test_a_setting_that_does_not_take_is_reported(cublas_flags, monkeypatch, caplog):
    import torch

    from basal.backends.cuda.gpu.environment import apply_invariant_settings

    monkeypatch.setattr(torch._C, "_set_cublas_allow_bf16_reduced_precision_reduction", lambda *a: None)
    read = apply_invariant_settings()
    assert read["allow_bf16_reduced_precision_reduction_split_k"] is True
    assert "did not take effect" in caplog.text and "bf16_reduced_precision_reduction_split_k" in caplog.text


def test_graph_capture_is_thread_local(monkeypatch):
    """`basal serve` captures a new bucket on one lane's thread while another lane polls its batch's event; in CUDA's
    default global mode that poll would invalidate the capture. The capture must ask for thread-local mode."""
    import torch

    from basal.backends.cuda.gpu.graphs import CudaCapture

    seen = {}

    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            seen["mode"] = capture_error_mode

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    ran = []
    assert CudaCapture("cuda:0")(lambda: ran.append(1)) == "graph"
    assert ran == [1] and seen["mode"] == "thread_local"


def test_a_failed_capture_gives_the_thread_its_stream_back(monkeypatch):
    """torch.cuda.graph's exit ends the capture before it restores the stream: when ending raises, the capture
    stream stays current and the thread's later kernels would run on a second, unordered stream."""
    import torch

    from basal.backends.cuda.gpu.graphs import CudaCapture

    current = []

    class Stream:
        def wait_stream(self, other):
            pass

    first = Stream()

    class Graph:  # as torch 2.11's: the stream is set on entry, restored only after capture_end succeeds
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            self.stream = stream

        def __enter__(self):
            current.append(self.stream)

        def __exit__(self, *exc):
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: first)
    monkeypatch.setattr(torch.cuda, "set_stream", current.append)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    capture = CudaCapture("cuda:0")
    with pytest.raises(RuntimeError, match="Invalidated"):
        capture(lambda: None)
    assert current == [capture.stream, first]  # the capture stream, then the thread's own again


def test_row_ranges_keep_every_range_inside_32_bit_offsets():
    from basal.backends.cuda.gpu.row_chunks import OFFSET_LIMIT, ROW_ALIGN, row_ranges

    assert row_ranges(8192, 28672) == [(0, 8192)]  # every graph bucket: one launch
    width = 2 * 14336  # max's [T, 2F] gate/up rows
    ranges = row_ranges(200_000, width)
    assert ranges[0] == (0, 74752) and ranges[-1][1] == 200_000  # 74 899 rows would pass 2^31 elements
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert all(start % ROW_ALIGN == 0 and (end - start) * width < OFFSET_LIMIT for start, end in ranges)
    with pytest.raises(ValueError, match="too wide"):
        row_ranges(1000, OFFSET_LIMIT // 100)  # not even ROW_ALIGN rows fit


def test_the_gemm_table_key_names_the_nvidia_driver(tmp_path):
    """The driver a table was probed under is the kernel module's version (what a driver update changes), read
    from /proc; both the proprietary and the open module print it after "Kernel Module"."""
    from basal.backends.cuda.gpu.environment import nvidia_driver

    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC ...\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.03  Release Build  (dvs@x)  Mon\n"
    for text, expected in ((proprietary, "535.104.05"), (open_module, "580.159.03"), ("garbage\n", None)):
        path = tmp_path / "version"
        path.write_text(text)
        assert nvidia_driver(str(path)) == expected
    assert nvidia_driver(str(tmp_path / "missing")) is None


def test_a_weight_past_f16s_range_is_refused_with_what_to_do():
    """A bf16 checkpoint may hold values f16 cannot (above 65504): converted silently they would be inf, and every
    logit they touch NaN. Loading names the weight and the dtype that can hold it."""
    import torch

    from basal.backends.cuda.gpu.weights_direct import fit

    big = torch.tensor([1.0, 7e4], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"model.norm.weight .*--dtype bf16"):
        fit("model.norm.weight", big, torch.float16)
    assert fit("w", big, torch.bfloat16).dtype == torch.bfloat16  # bf16 holds it
    assert torch.isfinite(fit("w", big, torch.float32)).all()  # and f32
    small = torch.tensor([1.0, -2.5])
    assert torch.equal(fit("w", small, torch.float16), small.half())


def test_gemm_tables_saved_at_once_never_share_a_temporary_file(tmp_path, monkeypatch):
    """Two servers probing at once: each writes a temporary file of its own and renames it; a fixed temporary name
    let one rename the other's half-written file."""
    paths = []
    real = home.tempfile.mkstemp
    monkeypatch.setattr(home.tempfile, "mkstemp", lambda **kw: paths.append(real(**kw)) or paths[-1])
    target = tmp_path / "gpu" / "gemm_table-f16.json"
    for gpu in ("H200", "H100"):
        gt.GemmTable({"gpu": gpu}, [4], [gt.ShapeEntry(16, 32, "tri")]).save(target)
    assert len({p for _, p in paths}) == 2 and gt.GemmTable.from_json(target.read_text()).key == {"gpu": "H100"}
    assert sorted(f.name for f in target.parent.iterdir()) == [target.name]  # no temporary file left
