"""The GPU path's host side, in plain Python (runs everywhere, no Triton): buckets, the tile plan and its blob,
staging slots, the graph policy and the GEMM engine table (docs/gpu-path.md §8.1 c)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from basal.backends.cuda.gpu import engine_table as et
from basal.backends.cuda.gpu.buckets import (
    READOUT_BUCKETS,
    TOKEN_BUCKETS,
    long_lane_chunks,
    probed_row_counts,
    readout_bucket,
    token_bucket,
)
from basal.backends.cuda.gpu.graphs import GraphCache
from basal.backends.cuda.gpu.readback import ONE_OFF, StagingSlots, numpy_buffers
from basal.core.tile_plan import NO_RANGE, BlobLayout, pack_blob, plan_tiles, tile_capacity, unpack_blob
from basal.core.tree import TokenizedQuestion, plan_forwards


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
    (forward,) = plan_forwards([q, r], [40, 41], {"en": (1, 2), "pl": (5,)})
    return forward.batch


def test_tile_plan_covers_every_token_once_without_mixing_blocks():
    batch = _batch()
    plan = plan_tiles(batch, {"en": (0, 2), "pl": (2, 1)}, tokens_per_tile=2)
    covered = []
    for q0, nq, pos0, block in plan.tiles:
        assert 1 <= nq <= 2 and batch.positions[q0] == pos0
        assert all(batch.block_of[q0 + i] == block and batch.positions[q0 + i] == pos0 + i for i in range(nq))
        covered += range(q0, q0 + nq)
    assert sorted(covered) == list(range(batch.n_tokens))
    assert [tuple(t) for t in plan.readout_tiles[:, :2]] == [(int(r), 1) for r in batch.readouts]


def test_chain_ranges_map_every_position_to_its_key_row():
    batch = _batch()
    prefix_rows = {"en": (0, 2), "pl": (2, 1)}
    plan = plan_tiles(batch, prefix_rows, tokens_per_tile=4)
    for b in range(len(batch.block_start)):
        chain = batch.chain(b)
        expected = []  # (buffer, row) of positions 0 .. end of block b
        key = batch.prefix_keys[batch.block_prefix[chain[0]]]
        expected += [(0, prefix_rows[key][0] + i) for i in range(prefix_rows[key][1])]
        for c in chain:
            expected += [(1, batch.block_start[c] + i) for i in range(batch.block_len[c])]
        ranges = plan.ranges[b]
        used = ranges[ranges[:, 0] != NO_RANGE, 0]
        assert len(used) == len(chain) + 1 and np.all(np.diff(used) > 0)  # the prefix range, then the chain
        for kp, want in enumerate(expected):
            r = max(i for i in range(len(ranges)) if ranges[i, 0] <= kp)
            assert (ranges[r, 1], ranges[r, 2] + kp - ranges[r, 0]) == want


def test_blob_round_trip_and_no_stale_fields():
    batch = _batch()
    plan = plan_tiles(batch, {"en": (0, 2), "pl": (2, 1)}, tokens_per_tile=3)
    layout = BlobLayout(32, 16, tile_capacity(32, 3))
    blob = np.full(layout.size, 77, dtype=np.int32)
    pack_blob(batch, plan, layout, blob)
    back = unpack_blob(blob, layout)
    assert np.array_equal(back["tokens"], batch.tokens) and np.array_equal(back["positions"], batch.positions)
    assert np.array_equal(back["tiles"], plan.tiles) and np.array_equal(back["readouts"], batch.readouts)
    assert np.array_equal(back["ranges"][: len(plan.ranges)], plan.ranges)
    assert np.all(back["ranges"][len(plan.ranges) :] == 0) and 77 not in blob
    with pytest.raises(ValueError, match="does not fit"):
        pack_blob(batch, plan, BlobLayout(16, 4, 100))


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


def _table(engine_ms):
    cands = {n: et.Candidate(ok, ms) for n, (ok, ms) in engine_ms.items()}
    return et.EngineTable({"gpu": "H200", "dtype": "f16"}, [32, 64], [et.ShapeEntry(64, 128, et.choose(cands), cands)])


def test_engine_choice():
    assert et.choose({"lt": et.Candidate(True, 0.02), "tri": et.Candidate(True, 0.03)}) == "lt"
    assert et.choose({"lt": et.Candidate(True, 0.05), "tri": et.Candidate(True, 0.03)}) == "tri"
    assert et.choose({"lt": et.Candidate(False, None), "tri": et.Candidate(True, None)}) == "tri"
    with pytest.raises(RuntimeError, match="no GEMM engine"):
        et.choose({"lt": et.Candidate(False), "tri": et.Candidate(False)})


def test_engine_table_round_trip_and_staleness(tmp_path):
    table = _table({"lt": (True, 0.02), "tri": (True, 0.03)})
    path = tmp_path / "gemm_engines-f16.json"
    table.save(path)
    loaded, why = et.load_table(path, {"gpu": "H200", "dtype": "f16"})
    assert why == "current" and loaded.engine(64, 128) == "lt" and loaded.to_json() == table.to_json()
    stale, why = et.load_table(path, {"gpu": "H200", "dtype": "f16", "driver": "590.1"})
    assert stale is None and why.startswith("stale: driver")
    assert et.load_table(tmp_path / "none.json", {})[0] is None
    with pytest.raises(KeyError, match="not probed"):
        loaded.engine(1, 2)
    assert "-> lt" in "\n".join(et.describe(loaded, why))
    assert et.table_key({"gpu": "x"}, "bf16") == {"gpu": "x", "dtype": "bf16"}


def test_warm_up_buckets_are_real_buckets_and_fit_the_graph_cache():
    from basal.backends.cuda.gpu.buckets import warm_buckets
    from basal.backends.cuda.gpu.graphs import MAX_GRAPHS

    pairs = warm_buckets()
    assert len(pairs) == 37 <= MAX_GRAPHS  # the LRU never evicts a warmed graph before a request uses it
    assert all(token_bucket(t) == t and readout_bucket(r) == r and r * 8 <= t for t, r in pairs)
    assert (32, 4) in pairs and (2048, 64) in pairs and (64, 16) not in pairs


def test_engine_table_keeps_the_fused_epilogues():
    table = _table({"tri": (True, 0.03)})
    table.shapes[0].fused, table.shapes[0].fused_detail = "swiglu", "4 row counts x 3 anchors equal"
    loaded = et.EngineTable.from_json(table.to_json())
    assert loaded.fused(64, 128) == "swiglu" and loaded.fused(1, 2) == ""
    assert "fused swiglu" in "\n".join(et.describe(loaded, "current"))
    old = json.loads(table.to_json())
    for s in old["shapes"]:
        del s["fused"], s["fused_detail"]
    assert et.EngineTable.from_json(json.dumps(old)).fused(64, 128) == ""  # a table from before: nothing fused


def test_the_library_engine_adds_a_bias():
    """`lt` with a bias is `addmm`: cuBLASLt's bias epilogue on a GPU, the CPU's GEMM here."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(8, 32, generator=g), torch.randn(16, 32, generator=g), torch.randn(16, generator=g)
    out = et.lt_linear(x, w, torch.empty(8, 16), b)
    assert torch.allclose(out, torch.nn.functional.linear(x, w, b), atol=1e-5)
    assert not torch.allclose(out, et.lt_linear(x, w, torch.empty(8, 16)), atol=1e-3)


def test_the_probe_passes_the_bias_and_times_engines_only_where_it_has_a_choice(monkeypatch):
    import torch

    seen = []

    def by_rows(x, w, out, bias=None):  # one row at a time: invariant over M by construction
        seen.append(bias is not None)
        for i in range(x.shape[0]):
            out[i] = x[i] @ w.T + (0 if bias is None else bias)
        return out

    monkeypatch.setitem(et.ENGINES, "lt", by_rows)
    monkeypatch.setitem(et.ENGINES, "tri", by_rows)
    cpu = torch.device("cpu")
    one = et.probe([(16, 32)], torch.float32, cpu, [4, 16], {}, ("tri",), timing_rows=8, bias=True)
    assert one.shapes[0].bias and all(seen) and one.shapes[0].candidates["tri"].ms is None
    two = et.probe([(16, 32)], torch.float32, cpu, [4, 16], {}, ("lt", "tri"), timing_rows=8)
    assert all(c.ms is not None for c in two.shapes[0].candidates.values()) and not two.shapes[0].bias


def test_an_engine_table_that_cannot_be_saved_does_not_stop_a_start(tmp_path, caplog):
    pytest.importorskip("triton")  # the GPU backend module imports Triton's kernels
    from basal.backends.cuda.gpu.backend import keep_table

    table = et.EngineTable({"gpu": "H200"}, [4], [et.ShapeEntry(16, 32, "tri")])
    assert keep_table(table, tmp_path / "gpu" / "t.json") and (tmp_path / "gpu" / "t.json").is_file()
    (tmp_path / "file").write_text("")
    assert not keep_table(table, tmp_path / "file" / "gpu" / "t.json")  # its parent is a file: OSError
    assert "not saved" in caplog.text


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


def test_the_engine_table_key_names_the_nvidia_driver(tmp_path):
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
