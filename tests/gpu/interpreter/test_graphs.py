"""The graph bookkeeping under the interpreter: graphs made by `rerun_capture` (replay runs the captured closure
again, keeping what the capture saw, as a CUDA graph does), on a toy f16 model. One graph serves a bucket for every
letter set, since the letters' rows are copied into the arena before each replay; `warm_up` captures the common
buckets at start, and a request at such a bucket replays with the bits of an eager pass."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from basal.backends.cuda.gpu.backend import GpuBackend
from basal.backends.cuda.gpu.graphs import rerun_capture
from basal.backends.cuda.gpu.readback import DoneEvent, StagingSlots
from basal.backends.cuda.gpu.weights_direct import DeviceWeights
from basal.core.model.model_dir import LlamaConfig
from basal.core.packing.passes import overlapped, run_to_end
from basal.core.packing.tree import TokenizedQuestion, split_forwards

CPU = torch.device("cpu")
LETTERS = {3: [0, 1, 2], 5: [5, 6, 7, 8, 9]}
TOY = LlamaConfig(64, 128, 1, 6, 1, 16, 64, 1e-5, 1e6, 256, False)  # one layer: the bookkeeping is under test


@pytest.fixture(scope="module")
def weights():
    return DeviceWeights.random(TOY, torch.float16, CPU, seed=3)


def backend(weights, graphs: bool) -> GpuBackend:
    capture = rerun_capture if graphs else None
    return GpuBackend(None, "f16", CPU, weights=weights, arena_tokens=32, graphs=graphs, capture=capture)


def batch(letters: list[int], seed: int = 1, orders: int = 2, shared: int = 9):
    rng = random.Random(seed)
    prompts = tuple((*(rng.randrange(64) for _ in range(shared)), i) for i in range(orders))
    (forward,) = split_forwards([TokenizedQuestion("en", "s", prompts)], letters, {})
    return forward.packed


@pytest.fixture(scope="module")
def plain(weights):
    return backend(weights, graphs=False)


@pytest.fixture(scope="module")
def graphed(weights):
    return backend(weights, graphs=True)


@pytest.fixture(scope="module")
def eager(plain):
    """Logits of the backend without graphs for two disjoint letter sets."""
    return {n: run_to_end(plain.run(batch(LETTERS[n]))) for n in (3, 5)}


def test_one_graph_serves_every_letter_set_with_the_eager_bits(graphed, eager):
    assert eager[3].tobytes() != eager[5][:, :3].tobytes()  # the letter sets' logits differ: stale rows would show
    graphed.graphs.clear()
    runs = [run_to_end(graphed.run(batch(LETTERS[3]))) for _ in range(3)]  # eager, capture + replay, replay
    assert list(graphed.graphs.graphs) == [(32, 4)]
    assert all(r.tobytes() == eager[3].tobytes() for r in runs)
    other = run_to_end(graphed.run(batch(LETTERS[5])))  # the same bucket, other letters: a replay
    assert len(graphed.graphs.graphs) == 1
    assert other.tobytes() == eager[5].tobytes()


def test_warm_up_captures_the_common_buckets_and_a_request_replays_them(graphed, eager):
    graphed.graphs.clear()
    assert graphed.warm_up(max_tokens=32) == 1
    assert list(graphed.graphs.graphs) == [(32, 4)]
    assert graphed.graphs.step((32, 4)) == "replay"  # what the next request at that bucket does
    assert run_to_end(graphed.run(batch(LETTERS[5]))).tobytes() == eager[5].tobytes()
    assert len(graphed.graphs.graphs) == 1


def test_without_graphs_warm_up_does_nothing(plain):
    assert plain.warm_up() == 0


def test_describe_names_the_gemms_and_the_graphs(plain, graphed):
    facts = plain.describe()
    assert facts["backend"] == "torch" and facts["dtype"] == "f16" and facts["cuda_graphs"] == "off"
    assert facts["gemm_kernels"] == {"128x64": "tri", "64x96": "tri", "256x64": "tri", "64x128": "tri"}
    assert facts["attention"] == "f32" and facts["gpu"] == "cpu (Triton interpreter)"
    assert graphed.describe()["cuda_graphs"].endswith(" captured")


def test_a_prepared_forward_has_the_bits_of_an_unprepared_one(plain, eager, monkeypatch):
    b = batch(LETTERS[5])
    prepared = plain.prepare(b)
    planned = []
    monkeypatch.setattr(plain, "_plan", lambda *a, **k: planned.append(1) or GpuBackend._plan(plain, *a, **k))
    assert run_to_end(plain.run(b, prepared=prepared)).tobytes() == eager[5].tobytes()
    assert planned == []  # the prepared layout was used
    monkeypatch.setattr(plain, "_prefix_version", plain._prefix_version + 1)  # as moved prefix rows do
    assert run_to_end(plain.run(b, prepared=prepared)).tobytes() == eager[5].tobytes()
    assert planned == [1]  # planned again, not trusted


@pytest.fixture(scope="module")
def two_layers():
    """Two layers, no graphs: a down projection feeds the next layer's norm, and the last one the head's."""
    return GpuBackend(
        None, "f16", CPU, weights=DeviceWeights.random(replace(TOY, num_hidden_layers=2), torch.float16, CPU),
        arena_tokens=32, graphs=False,
    )  # fmt: skip


def test_an_eager_pass_paused_between_layers_keeps_its_own_metadata(two_layers):
    """A pass paused after its first layer while another pass at the same bucket runs (the long lane steps aside)
    must read its own tile layout and positions in its later layers: eager passes do not share the bucket's blob;
    and a pass with a larger metadata blob meanwhile must not wait for the paused pass's staging slot."""
    alone = run_to_end(two_layers.run(batch(LETTERS[3])))
    steps = two_layers.run(batch(LETTERS[3]))
    next(steps)  # the first layer is done: paused
    other = batch(LETTERS[5], seed=8, orders=1, shared=25)  # 26 tokens at other positions: the same bucket
    run_to_end(two_layers.run(other))
    # a larger blob while the paused pass holds a staging slot: a slot of its own, not a wait for the paused pass
    # (which waits for this one: it used to deadlock here)
    run_to_end(two_layers.run(batch(LETTERS[5], seed=9, orders=3, shared=20)))
    assert run_to_end(steps).tobytes() == alone.tobytes()


class DeviceEvent(DoneEvent):
    """An event as CUDA has it: complete until recorded, then pending at its next query (a device still busy) unless
    synchronised."""

    def __init__(self):
        self.pending, self.log = False, []

    def record(self, stream=None) -> None:
        self.pending = True
        self.log.append("record")

    def query(self) -> bool:
        done, self.pending = not self.pending, False
        return done

    def synchronize(self) -> None:
        self.pending = False
        self.log.append("synchronize")


def test_a_pass_closed_between_layers_waits_for_its_metadata_copy_before_freeing_its_slot(two_layers, monkeypatch):
    """The long lane's pass abandoned after a layer (its clients gone) has queued a non-blocking copy from its
    slot's pinned blob that a busy device may not have run yet: the slot's event must cover that copy and be waited
    for before the slot is free, or the next pass overwrites the blob under the copy."""
    slots = StagingSlots(two_layers._host_buffers, DeviceEvent)
    monkeypatch.setattr(two_layers, "slots", slots)
    steps = two_layers.run(batch(LETTERS[3]), preemptible=True)
    next(steps)  # paused after its first layer
    (held,) = [s for s in slots.slots if s.busy]
    steps.close()
    assert not held.busy and held.event.log == ["record", "synchronize"]
    run_to_end(two_layers.run(batch(LETTERS[3])))  # a whole pass: recorded at the copy in and at the readback
    assert held.event.log[2:] == ["record", "record"]


def test_forwards_in_flight_together_keep_their_bits(graphed, plain, monkeypatch):
    """Three forwards at one bucket through `overlapped`, as the pipeline runs a batch: each is queued while the
    one before waits for its readback (two staging slots out at once), through the eager pass, the capture and the
    replay; each gives the bits it gives alone."""
    graphed.graphs.clear()
    monkeypatch.setattr(graphed, "slots", StagingSlots(graphed._host_buffers, DeviceEvent))
    batches = [batch(LETTERS[3], seed=s) for s in (1, 2, 3)]
    alone = [run_to_end(plain.run(b)) for b in batches]
    results, busy = {}, []
    steps = overlapped((graphed.run(b) for b in batches), results.__setitem__)
    while True:
        try:
            next(steps)
        except StopIteration:
            break
        busy.append(sum(s.busy for s in graphed.slots.slots))
    assert max(busy) == 2 and list(graphed.graphs.graphs) == [(32, 4)]
    assert [results[i].tobytes() for i in range(3)] == [a.tobytes() for a in alone]
    assert len({a.tobytes() for a in alone}) == 3  # three different answers: a mix-up would show


def test_a_failed_capture_serves_the_forward_eagerly_and_stops_capturing(graphed, plain, monkeypatch, caplog):
    """A capture that raises (CUDA invalidated it, say) must not fail the request nor every later one at that
    bucket: the forward runs eagerly with the same bits, and no bucket tries to capture again."""
    from basal.backends.cuda.gpu.graphs import GraphCache

    tries = []

    def broken(run):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphed, "graphs", GraphCache())
    monkeypatch.setattr(graphed, "_capture", broken)
    b, other = batch(LETTERS[3]), batch(LETTERS[3], seed=2, orders=1, shared=40)  # two buckets
    alone = run_to_end(plain.run(b))
    results = [run_to_end(graphed.run(b)) for _ in range(3)] + [run_to_end(graphed.run(other)) for _ in range(2)]
    assert all(r.tobytes() == alone.tobytes() for r in results[:3])
    assert results[3].tobytes() == run_to_end(plain.run(other)).tobytes()
    assert tries == [1] and not graphed.graphs.graphs  # one try in all, for every bucket
    assert "capturing stopped" in graphed.describe()["cuda_graphs"] and "capture at bucket" in caplog.text


def test_a_position_past_the_rope_table_is_refused_before_the_device(plain):
    """The RoPE kernel reads cos/sin at a token's position without a mask: past the table it would read other memory
    on a GPU, silently. The engine's length check keeps requests inside; the backend refuses what slips past it."""
    b = batch(LETTERS[3])
    run_to_end(plain.run(replace(b, positions=b.positions + (TOY.max_position_embeddings - 1 - b.positions.max()))))
    with pytest.raises(ValueError, match="past the model's 256 positions"):
        run_to_end(plain.run(replace(b, positions=b.positions + TOY.max_position_embeddings)))


def test_a_preemptible_pass_runs_eagerly_even_where_a_graph_is_captured(graphed, plain):
    """The long lane's pass must pause between layers: it runs the eager layers, not the bucket's graph."""
    graphed.graphs.clear()
    b = batch(LETTERS[3])
    for _ in range(2):  # eager, then captured
        run_to_end(graphed.run(b))
    (graph,) = graphed.graphs.graphs.values()
    replays = []
    graph.run, captured = (lambda: replays.append(1) or captured()), graph.run
    steps, yields = graphed.run(b, preemptible=True), 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            logits = done.value
            break
        yields += 1
    assert not replays and yields > TOY.num_hidden_layers  # a pause after every layer, then the readback
    assert logits.tobytes() == run_to_end(plain.run(b)).tobytes()
    run_to_end(graphed.run(b))
    assert replays == [1]  # the main lane still replays it


def test_fused_epilogues_give_the_bits_of_separate_kernels(two_layers, monkeypatch):
    """The `tri` GEMMs with the residual add and SwiGLU fused give every logit and evidence row of the separate
    kernels, over two layers (a fused down projection feeds the next layer's norm, the last one the head's)."""
    be = two_layers
    assert set(be.describe()["fused_epilogues"].values()) == {"residual", "swiglu"}
    b = batch(LETTERS[5], seed=7)
    fused = run_to_end(be.run(b)), run_to_end(be.run_with_hidden(b))
    monkeypatch.setattr(be.net, "_fuses_shape", lambda n, k: False)  # the same backend, separate kernels
    separate = run_to_end(be.run(b)), run_to_end(be.run_with_hidden(b))
    assert fused[0].tobytes() == separate[0].tobytes()
    assert all(a.tobytes() == c.tobytes() for a, c in zip(fused[1], separate[1], strict=True))


def test_a_fused_swiglu_allocates_no_gate_up_activation(two_layers, monkeypatch):
    """Where gate_up fuses SwiGLU the [T, 2F] activation is never written, so neither the arena nor an eager pass
    holds one (470 MB of the arena on the max shapes); with separate kernels it is there."""
    be = two_layers
    assert be.net.allocate(32, 4).gate_up.shape == (32, 0) and be.net.allocate(32, 4).gate_up_r.shape == (4, 0)
    monkeypatch.setattr(be.net, "_fuses_shape", lambda n, k: False)
    assert be.net.allocate(32, 4).gate_up.shape == (32, 2 * be.weights.cfg.intermediate_size)
