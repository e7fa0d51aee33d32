"""The state cache on the GPU path, under the interpreter: a question's letter logits are bitwise those of the cache
off on a miss (the entry filled in the pass), on hits (eager, captured and replayed as a graph), on a partial hit,
after an eviction and a refill, after a compaction and after the buffers grew; an entry filled in a pass is the
state computed alone, every layer. Negative controls: an entry filled from rows one token off, or from the wrong
layer, and a plan that kept rows compaction moved, are caught.

Toy two-layer models drive the Backend protocol directly (hand-made forwards, as the pipeline packs them); graphs
are made by `rerun_capture`, which keeps the prefix buffers the capture saw, as a CUDA graph keeps their
addresses. The demo model through the pipeline and its `StateCache` is at the end (slow)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from basal.backends.cuda.gpu import backend as gpu_backend
from basal.backends.cuda.gpu.backend import GpuBackend, Prepared
from basal.backends.cuda.gpu.graphs import rerun_capture
from basal.backends.cuda.gpu.prefix_slab import FillRows
from basal.backends.cuda.gpu.weights_direct import DeviceWeights
from basal.core.model.model_dir import LlamaConfig
from basal.core.packing.passes import run_to_end
from basal.core.packing.tree import TokenizedQuestion, split_forwards

CPU = torch.device("cpu")
LETTERS = [0, 1, 2]
TOY = LlamaConfig(64, 128, 2, 6, 1, 16, 64, 1e-5, 1e6, 256, False)  # two layers: a layer mix-up would show
# (dtype, attention precision): 32- and 64-key tiles; f16 in the slow run (the interpreter suite's time)
DTYPES = [pytest.param(("f32", "f32"), id="f32"), pytest.param(("f16", "f16"), id="f16", marks=pytest.mark.slow)]

_rng = random.Random(7)
TEMPLATE = tuple(_rng.randrange(64) for _ in range(7))


def tokens(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(64) for _ in range(n))


STATE = tokens(40, 1)  # the template and the state end inside the second key tile
QUESTIONS = [tokens(4, 10 + i) for i in range(4)]


def make(dtype: str, attention: str, graphs: bool = True) -> GpuBackend:
    weights = DeviceWeights.random(TOY, {"f32": torch.float32, "f16": torch.float16}[dtype], CPU, seed=3)
    capture = rerun_capture if graphs else None
    be = GpuBackend(
        None, dtype, CPU, attention=attention, weights=weights, arena_tokens=32, graphs=graphs, capture=capture
    )
    be.prefix("en", TEMPLATE)
    return be


def packed(state, question, prefix_key=None, fill=None, entries=None):
    """The forward of one question on `state` (two option orders), as the pipeline packs it: after the template
    prefix, or after the cached entry `prefix_key` (`entries`: key -> its state); `fill`: the entry it fills."""
    prefixes = {"en": TEMPLATE, **{k: TEMPLATE + s for k, s in (entries or {}).items()}}
    prompts = tuple((*TEMPLATE, *state, *question, i) for i in range(2))
    fill = None if fill is None else (fill, len(TEMPLATE) + len(state))
    q = TokenizedQuestion("en", "s", prompts, prefix_key=prefix_key, fill=fill)
    (forward,) = split_forwards([q], LETTERS, prefixes)
    return forward.packed


def run(be: GpuBackend, batch) -> bytes:
    return run_to_end(be.run(batch)).tobytes()


def entry_bits(be: GpuBackend, key: str) -> list[tuple[bytes, bytes]]:
    first, n = be.net.prefix_rows[key]
    slab = be.net.slab
    return [(k[first : first + n].numpy().tobytes(), v[first : first + n].numpy().tobytes()) for k, v in layers(slab)]


def layers(slab):
    return zip(slab.k, slab.v, strict=True)


def off(be_off: GpuBackend, state, question) -> bytes:
    return run(be_off, packed(state, question))


@pytest.fixture(scope="module", params=DTYPES)
def pair(request):
    """A backend with the state cache's rows reserved, and one without (the cache off), on the same weights."""
    dtype, attention = request.param
    on = make(dtype, attention)
    on.reserve_states(on.net.slab.row_bytes * 4 * (len(TEMPLATE) + len(STATE) + 8))
    return on, make(dtype, attention, graphs=False)


def test_miss_hit_partial_hit_and_off_give_the_same_bits(pair):
    be, cold = pair
    slab = be.net.slab
    generation = slab.generation
    miss = packed(STATE, QUESTIONS[0], fill="s1")
    assert miss.fills and miss.fills[0][1] == "en"
    assert run(be, miss) == off(cold, STATE, QUESTIONS[0])
    assert be.net.prefix_rows["s1"][1] == len(TEMPLATE) + len(STATE)
    be.graphs.clear()
    hit = packed(STATE, QUESTIONS[1], prefix_key="s1", entries={"s1": STATE})
    assert hit.n_tokens < 10  # the state is read, not computed
    hits = [run(be, hit) for _ in range(3)]  # eager, captured, replayed
    assert list(be.graphs.graphs) == [(32, 4)]
    assert hits == [off(cold, STATE, QUESTIONS[1])] * 3
    # the entry the pass filled is the state computed alone (`prefix` with a base, as a miss computed before fills)
    be.prefix("s1-alone", STATE, "en")
    assert entry_bits(be, "s1") == entry_bits(be, "s1-alone")
    # a partial hit: a longer state read after the cached one, filling the whole
    longer = STATE + tokens(9, 2)
    partial = packed(longer, QUESTIONS[2], prefix_key="s1", fill="s2", entries={"s1": STATE})
    assert partial.fills[0][1] == "s1" and partial.n_tokens < 25
    assert run(be, partial) == off(cold, longer, QUESTIONS[2])
    be.prefix("s2-alone", longer[len(STATE) :], "s1")
    assert entry_bits(be, "s2") == entry_bits(be, "s2-alone")
    again = packed(longer, QUESTIONS[3], prefix_key="s2", entries={"s2": longer})
    assert [run(be, again) for _ in range(3)] == [off(cold, longer, QUESTIONS[3])] * 3
    # counted exactly: K (attention dtype) and V (model dtype), every layer, every row of the entry
    k_size, v_size = slab.k[0].element_size(), slab.v[0].element_size()
    per_row = TOY.num_hidden_layers * TOY.num_key_value_heads * TOY.head_dim * (k_size + v_size)
    assert be.prefix_bytes("s2") == (len(TEMPLATE) + len(longer)) * per_row
    assert slab.generation == generation and len(be.graphs.graphs) == 1  # the reservation held: no graph dropped


@pytest.mark.slow  # 20 s a dtype under the interpreter; test_prefix_slab.py checks compaction on the host
def test_eviction_refill_compaction_and_growth_keep_the_bits(pair):
    """Three entries fill the reserved rows; two are evicted; a longer one fits only once the third slides down
    (compaction: the graph that replays hits on it stays valid); the first comes back, past the reservation (the
    buffers grow and the graphs go)."""
    be, cold = pair
    for key in list(be.net.prefix_rows):
        if key != "en":
            be.drop_prefix(key)
    states = [tokens(20, 30 + i) for i in range(3)]
    m = len(TEMPLATE) + 20
    slab = be.net.slab
    slab.compact()
    rows = slab.capacity - slab.used_rows - 3 * m  # taken, so that exactly three entries' rows are free
    assert rows > 0
    slab.place(
        "filler",
        [(torch.zeros(rows, *k.shape[1:], dtype=k.dtype), torch.zeros_like(v[:rows])) for k, v in layers(slab)],
    )
    for i, s in enumerate(states):
        assert run(be, packed(s, QUESTIONS[0], fill=f"e{i}")) == off(cold, s, QUESTIONS[0])
    assert be.net.slab.capacity - be.net.slab.used_rows < m
    be.graphs.clear()
    hit = packed(states[1], QUESTIONS[1], prefix_key="e1", entries={"e1": states[1]})
    want = off(cold, states[1], QUESTIONS[1])
    assert [run(be, hit) for _ in range(2)] == [want] * 2  # eager, then captured
    stale = be.prepare(hit)
    be.drop_prefix("e0")
    be.drop_prefix("e2")
    generation, version = be.net.slab.generation, be._prefix_version
    longer = tokens(30, 40)
    assert run(be, packed(longer, QUESTIONS[2], fill="e3")) == off(cold, longer, QUESTIONS[2])
    assert be.net.slab.generation == generation and be._prefix_version > version  # compacted, not grown
    assert be.net.prefix_rows["e1"][0] < be.net.prefix_rows["e3"][0]
    assert len(be.graphs.graphs) == 1 and run(be, hit) == want  # the graph replays with the moved rows
    assert run_to_end(be.run(hit, prepared=stale)).tobytes() == want  # a plan from before is made again
    forged = Prepared(stale.layout, stale.blob, be._prefix_version)  # negative control: trusted as current
    assert run_to_end(be.run(hit, prepared=forged)).tobytes() != want
    hit3 = packed(longer, QUESTIONS[3], prefix_key="e3", entries={"e3": longer})
    assert run(be, hit3) == off(cold, longer, QUESTIONS[3])
    # the evicted state again, computed alone (`prefix`): past the reserved rows, so the buffers grow
    be.prefix("e0", states[0], "en")
    assert be.net.slab.generation == generation + 1 and not be.graphs.graphs
    hit0 = packed(states[0], QUESTIONS[3], prefix_key="e0", entries={"e0": states[0]})
    assert [run(be, hit0) for _ in range(3)] == [off(cold, states[0], QUESTIONS[3])] * 3
    assert [run(be, hit) for _ in range(3)] == [want] * 3


def test_a_pass_stopped_before_its_end_leaves_no_entry(pair):
    be, _ = pair
    steps = be.run(packed(STATE, QUESTIONS[0], fill="stopped"))
    next(steps)  # the first layer is done
    steps.close()
    assert "stopped" not in be.net.prefix_rows and not be._reading


def test_a_pass_paused_in_flight_reads_its_entry_where_it_was_planned(f32_pair):
    """The long lane's pass pauses after a layer while another pass fills an entry that fits only if compaction
    moved the paused pass's entry into the free rows below it: the entry stays (the buffers grow instead), and the
    paused pass ends with the bits of the cache off."""
    _, cold = f32_pair
    be = make("f32", "f32", graphs=False)
    slab = be.net.slab
    be.reserve_states(slab.row_bytes * (30 + 27 + 10))
    slab.place(
        "pad", [(torch.zeros(30, *k.shape[1:], dtype=k.dtype), torch.zeros_like(v[:30])) for k, v in layers(slab)]
    )
    state = tokens(20, 50)
    run(be, packed(state, QUESTIONS[0], fill="x"))
    assert be.net.prefix_rows["x"] == (len(TEMPLATE) + 30, 27)
    be.drop_prefix("pad")  # 30 free rows below x, 10 after it
    steps = be.run(packed(state, QUESTIONS[1], prefix_key="x", entries={"x": state}), preemptible=True)
    next(steps)  # paused after its first layer, reading x
    other = tokens(25, 51)  # 32 rows: more than either free range
    generation = slab.generation
    assert run(be, packed(other, QUESTIONS[2], fill="y")) == off(cold, other, QUESTIONS[2])
    assert be.net.prefix_rows["x"] == (len(TEMPLATE) + 30, 27) and slab.generation == generation + 1  # grown
    assert run_to_end(steps).tobytes() == off(cold, state, QUESTIONS[1])
    assert not be._reading


@pytest.fixture(scope="module")
def f32_pair():
    on = make("f32", "f32", graphs=False)
    on.reserve_states(on.net.slab.row_bytes * 200)
    return on, make("f32", "f32", graphs=False)


def test_a_pass_with_hidden_states_fills_its_entry_too(f32_pair):
    """A diagnostics question's pass (`run_with_hidden`) fills the entry it is due to fill, with the bits of the
    state computed alone, and keeps the logits of `run`."""
    be, cold = f32_pair
    miss = packed(STATE, QUESTIONS[0], fill="hidden")
    logits, _ = run_to_end(be.run_with_hidden(miss))
    assert logits.tobytes() == off(cold, STATE, QUESTIONS[0])
    be.prefix("hidden-alone", STATE, "en")
    assert entry_bits(be, "hidden") == entry_bits(be, "hidden-alone")


def test_negative_control_a_fill_one_token_off_is_caught(f32_pair):
    be, cold = f32_pair
    miss = packed(STATE, QUESTIONS[0], fill="shifted")
    key, base, rows = miss.fills[0]
    run(be, replace(miss, fills=((key, base, rows + 1),)))
    be.prefix("right", STATE, "en")
    assert entry_bits(be, "shifted") != entry_bits(be, "right")
    hit = packed(STATE, QUESTIONS[1], prefix_key="shifted", entries={"shifted": STATE})
    assert run(be, hit) != off(cold, STATE, QUESTIONS[1])


def test_negative_control_a_fill_from_the_wrong_layer_is_caught(f32_pair, monkeypatch):
    be, cold = f32_pair

    class SwappedLayers(FillRows):
        def entries(self):
            return [(key, base, kv[::-1]) for key, base, kv in super().entries()]

    monkeypatch.setattr(gpu_backend, "FillRows", SwappedLayers)
    run(be, packed(STATE, QUESTIONS[0], fill="swapped"))
    hit = packed(STATE, QUESTIONS[1], prefix_key="swapped", entries={"swapped": STATE})
    assert run(be, hit) != off(cold, STATE, QUESTIONS[1])


def test_without_the_state_cache_the_buffers_hold_the_template_prefixes_only():
    be = make("f16", "f32", graphs=False)
    be.prefix("pl", tokens(5, 3))
    assert be.net.slab.capacity == len(TEMPLATE) + 5 and be.net.slab.k[0].shape[0] == len(TEMPLATE) + 5
    assert be.caches_states and be.prefix_bytes("pl") == 5 * be.net.slab.row_bytes


# -- the demo model through the pipeline and its state cache --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_the_pipelines_state_cache_keeps_the_bits_on_the_demo_model(demo_model, dtype):
    """Miss, hits (graphs replayed), a partial hit, an eviction and a refill through `Pipeline` and `StateCache`,
    each bitwise the cache off."""
    from basal.core.engine.pipeline import Pipeline
    from tests.determinism.harness import Harness, same_bits

    gpu = GpuBackend.load(
        demo_model, dtype=dtype, device="cpu", arena_tokens=128, progress=False, graphs=True, capture=rerun_capture
    )
    plain = Pipeline(demo_model, gpu)
    h = Harness.__new__(Harness)
    h.tok = demo_model.tokenizer
    rng = random.Random(3)
    first = h.question(rng, "en", state_words=40, k=2)
    on_state = [first, *(h.question(rng, "en", state=first.state, k=2) for _ in range(3))]
    longer = h.question(rng, "en", state=first.state + " refund invoice parcel", k=2)
    other = h.question(rng, "en", state_words=30, k=3)
    asked = [*on_state, longer, other]
    want = [run_to_end(plain.letter_logits([q]))[0] for q in asked]

    probe = Pipeline(demo_model, gpu, state_cache_mb=1)
    run_to_end(probe.letter_logits(on_state[:1]))
    one = probe.state_cache.bytes  # the bytes of the first state's entry
    probe.state_cache.clear()
    pipeline = Pipeline(demo_model, gpu, state_cache_mb=2.5 * one / (1 << 20))  # room for it and its extension
    cache = pipeline.state_cache
    got = [run_to_end(pipeline.letter_logits([q]))[0] for q in on_state]  # a miss, then hits
    assert cache.counts.misses == 1 and cache.counts.hits == 3
    got.append(run_to_end(pipeline.letter_logits([longer]))[0])
    assert cache.counts.partial_hits == 1
    got.append(run_to_end(pipeline.letter_logits([other]))[0])  # past the budget: an eviction
    assert cache.counts.evictions >= 1 and cache.bytes <= cache.budget
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    again = run_to_end(pipeline.letter_logits([on_state[0]]))[0]  # its entry was evicted: computed again
    assert same_bits(again, want[0])
    assert cache.bytes == sum(gpu.prefix_bytes(e.key) for e in cache._entries.values() if e.ready)


@pytest.mark.slow
def test_evidence_questions_read_and_fill_entries_with_the_same_bits(demo_model):
    """Evidence questions on the GPU path: a miss fills the entry (its K/V and its state rows' hidden states), a hit
    reads both and computes no state row; letter logits and evidence rows bitwise the cache off."""
    import numpy as np

    from basal.core.engine.pipeline import Pipeline
    from tests.determinism.harness import WORDS, bits, same_bits
    from tests.determinism.test_evidence_rows import _evidence_question

    gpu = GpuBackend.load(
        demo_model, dtype="f32", device="cpu", arena_tokens=128, progress=False, graphs=True, capture=rerun_capture
    )
    plain = Pipeline(demo_model, gpu)
    rng = random.Random(7)
    state = " ".join(rng.choice(WORDS["pl"]) for _ in range(40))
    asked = [_evidence_question(plain, rng, "pl", state=state) for _ in range(3)]
    want = [run_to_end(plain.letter_logits([q]))[0] for q in asked]

    pipeline = Pipeline(demo_model, gpu, state_cache_mb=8)
    cache = pipeline.state_cache
    got = [run_to_end(pipeline.letter_logits([q]))[0] for q in asked[:2]]  # a miss that fills, then a hit
    assert cache.counts.misses == 1 and cache.counts.hits == 1
    (forward,) = pipeline.pack_questions(asked[2:])
    assert len(forward.packed.hidden) == 0  # the hit's forward computes no state row
    got.append(run_to_end(pipeline.letter_logits(asked[2:]))[0])
    for a, b in zip(got, want, strict=True):
        assert same_bits(list(a), list(b)) and bits(np.asarray(a.states)) == bits(np.asarray(b.states))
