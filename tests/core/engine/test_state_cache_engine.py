"""The state cache in the engine: least recently used out first within the byte budget, one computation for a
state that two batches ask at once, no half-written entry from a pass that fails inside it, usage.cached_tokens
and the HRRN cost, and its series in /metrics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.engine.scheduler import Job, JobQueue, Policy
from basal.core.model.prompt import Item
from basal.core.packing.passes import run_to_end
from basal.serve.server import state_cache_series
from tests.stub_backend import StubBackend


def uniform(prompt: str, k: int) -> list[float]:
    return [1.0 / k] * k


def _question(pipeline: Pipeline, state: str, question: str = "Czy zwrot?"):
    item = Item("q", "noul", ("Tak", "Nie"), ("Tak", "Nie"), "pl", state, question)
    return pipeline.tokenize_items([item])[0]


STATES = [f"Stan numer {i}: " + " ".join(["paczka dotarła uszkodzona"] * 10) for i in range(4)]


def _stub_pipeline(demo_model, mb: float) -> Pipeline:
    return Pipeline(demo_model, StubBackend(demo_model, uniform), state_cache_mb=mb)


def _served(demo_model) -> tuple[Pipeline, Engines]:
    """A torch pipeline with a 16 MiB state cache behind an engine whose metrics carry the cache's series."""
    metrics = Metrics()
    pipeline = Pipeline(demo_model, TorchBackend.load(demo_model), state_cache_mb=16)
    engine = Engine(demo_model.name, pipeline, Gate(100.0), metrics, EngineSettings())
    engines = Engines({demo_model.name: engine}, demo_model.name, metrics)
    metrics.add_collector(state_cache_series(engines))
    return pipeline, engines


def test_least_recently_used_goes_first_within_the_budget(demo_model):
    probe = _stub_pipeline(demo_model, 1)
    run_to_end(probe.letter_logits([_question(probe, STATES[0])]))
    one = probe.state_cache.bytes  # the stub holds 8 bytes a token: every state here is about this size
    pipeline = _stub_pipeline(demo_model, 2.5 * one / (1 << 20))
    cache = pipeline.state_cache

    def ask(i: int) -> None:
        run_to_end(pipeline.letter_logits([_question(pipeline, STATES[i])]))

    ask(0), ask(1), ask(0)  # 0 is now more recent than 1
    ask(2)  # over the budget: 1 goes
    assert cache.counts.evictions == 1 and cache.bytes <= cache.budget
    hits = cache.counts.hits
    ask(0)
    assert cache.counts.hits == hits + 1  # 0 stayed
    ask(1)
    assert cache.counts.misses == 4  # 1 was evicted: computed again (0, 1, 2, then 1)
    assert set(pipeline.backend.prefixes) - {"pl", "en"} == {e.key for e in cache._entries.values() if e.ready}


@pytest.mark.parametrize("first_runs_first", [True, False])
def test_two_batches_asking_one_new_state_compute_it_once(demo_model, first_runs_first):
    pipeline = _stub_pipeline(demo_model, 16)
    computed = []  # states computed alone, outside the forward that reads them
    backend = pipeline.backend
    plain_prefix = backend.prefix
    backend.prefix = lambda key, tokens, base=None: computed.append(key) or plain_prefix(key, tokens, base)
    a, b = _question(pipeline, STATES[3], "Czy zwrot?"), _question(pipeline, STATES[3], "Czy szybko?")
    first, second = (
        pipeline.pack_questions([a]),
        pipeline.pack_questions([b]),
    )  # both packed before either runs (two lanes)
    entry = second[0].states[0]
    assert first[0].states == (entry,) and [key for key, _, _ in first[0].packed.fills] == [entry.key]
    assert second[0].packed.prefix_keys == (entry.key,) and not second[0].packed.fills  # it reads what first fills
    state = len(entry.ids) - len(pipeline.prefixes["pl"])
    assert first[0].packed.n_tokens > state and second[0].packed.positions.min() == len(entry.ids)
    runs = [([a], first), ([b], second)] if first_runs_first else [([b], second), ([a], first)]
    for questions, forwards in runs:
        run_to_end(pipeline.run_forwards(questions, forwards))
    # run first, the pass packed first fills the entry inside its forward: the state is computed once, in it; run
    # second, the other pass computes it alone first, and the filling pass keeps what is there
    assert computed == ([] if first_runs_first else [entry.key])
    assert entry.ready and pipeline.state_cache.counts.computed_tokens == state
    assert pipeline.state_cache.bytes == 8 * len(entry.ids) and entry.filler is None


def test_a_pass_that_fails_inside_a_state_leaves_no_entry(demo_model):
    backend = TorchBackend.load(demo_model)
    pipeline = Pipeline(demo_model, backend, state_cache_mb=16)
    q = _question(pipeline, STATES[0])
    reference = run_to_end(Pipeline(demo_model, backend).letter_logits([q]))[0]
    layer = backend.net.layer
    calls = []

    def failing(i, h, t, last):
        calls.append(i)
        if len(calls) == 2:  # the second layer of the state's computation
            raise RuntimeError("the device went away")
        return layer(i, h, t, last)

    backend.net.layer = failing
    with pytest.raises(RuntimeError):
        run_to_end(pipeline.letter_logits([q]))
    backend.net.layer = layer
    cache = pipeline.state_cache
    assert cache.entries == 0 and cache.bytes == 0
    assert set(backend.net.prefix_kv) == {"pl", "en"}  # nothing half-written in the backend either
    assert all(e.pins == 0 and e.filler is None for e in cache._entries.values())  # no pin, no claim left
    again = run_to_end(pipeline.letter_logits([q]))[0]
    assert [x.tobytes() for x in again] == [x.tobytes() for x in reference]


def test_usage_cost_and_metrics(demo_model):
    pipeline, engines = _served(demo_model)
    body = {"state": STATES[1], "questions": {"refund": {"type": "noul", "instructions": "Czy zwrot?"}}}
    other = {**body, "questions": {"fast": {"type": "noul", "instructions": "Czy szybko?"}}}
    cold = pipeline.cost([_question(pipeline, STATES[1])])
    with TestClient(create_app(engines, ApiSettings(metrics=True))) as client:
        first = client.post("/v1/basal", json=body).json()["usage"]
        second = client.post("/v1/basal", json=other).json()["usage"]
        text = client.get("/metrics").text
    warm = pipeline.cost([_question(pipeline, STATES[1])])
    assert first["cached_tokens"] == 0 and second["cached_tokens"] > 0
    assert second["cached_tokens"] < second["input_tokens"]
    (entry,) = [e for e in pipeline.state_cache._entries.values() if e.ready]
    assert warm == cold - (len(entry.ids) - len(pipeline.prefixes["pl"]))  # the cost: what a request will compute
    model = demo_model.name
    assert f'basal_state_cache_hits_total{{model="{model}"}} 1.0' in text
    assert f'basal_state_cache_misses_total{{model="{model}"}} 1.0' in text
    assert f'basal_state_cache_bytes{{model="{model}"}} {float(pipeline.state_cache.bytes)}' in text


def test_a_pass_budget_leaves_out_the_tokens_of_cached_states(demo_model):
    pipeline = _stub_pipeline(demo_model, 16)
    questions = ["Czy zwrot?", "Czy szybko?", "Czy pilne?", "Czy klient zły?"]
    jobs = [
        Job(None, [_question(pipeline, state, q)], 0, lambda r: None)  # type: ignore[arg-type]
        for state in STATES[:2]
        for q in questions
    ]
    two = [t for j in jobs[:2] for t in j.tokenized]  # two questions on one state
    budget = pipeline.cost(two) - 1
    queue = JobQueue(Policy.FIFO, pipeline.facts().prefix_tokens, pipeline.cached_prefix)

    def admitted() -> list[Job]:
        for job in jobs:
            queue.push(job)
        chosen = queue.admit(budget)
        queue.admit(1 << 62)  # empties the queue
        return chosen

    cold = admitted()
    assert jobs[1] not in cold  # a second question on the first job's state would pass the budget
    run_to_end(pipeline.letter_logits(jobs[0].tokenized))  # its state is cached now
    # the questions on the cached state compute their own tokens only, and the budget counts those
    warm = admitted()
    tokenized = [t for j in warm for t in j.tokenized]
    assert len(warm) > len(cold) and warm[:2] == jobs[:2] and all(t.state == STATES[0] for t in tokenized)
    computed = sum(f.packed.n_tokens for f in pipeline.pack_questions(tokenized))
    assert computed == pipeline.cost(tokenized) <= budget


def test_a_scope_reads_only_its_own_entries(demo_model):
    pipeline = _stub_pipeline(demo_model, 16)
    cache = pipeline.state_cache
    a = _question(pipeline, STATES[2])
    run_to_end(pipeline.letter_logits([replace(a, cache_scope="key-a")]))
    run_to_end(pipeline.letter_logits([replace(a, cache_scope="key-b")]))  # another key: a miss of its own
    assert cache.counts.misses == 2 and cache.counts.hits == 0 and cache.entries == 2
    assert pipeline.cost([replace(a, cache_scope="key-c")]) > pipeline.cost([replace(a, cache_scope="key-a")])
    run_to_end(pipeline.letter_logits([replace(a, cache_scope="key-a")]))
    assert cache.counts.hits == 1


def test_evidence_hits_count_in_usage_cost_and_metrics(demo_model):
    """An evidence request on a state whose entry keeps hidden states is a hit like any other: its usage, its cost
    and the counters say so; one on an entry without them computes its state and counts a miss."""
    pipeline, engines = _served(demo_model)
    backend = pipeline.backend

    def body(question: str, evidence: bool = True) -> dict:
        return {
            "state": STATES[2],
            "questions": {"q": {"type": "noul", "instructions": question, "evidence": evidence}},
        }

    def evidence_question(question: str):
        item = Item("q", "noul", ("Tak", "Nie"), ("Tak", "Nie"), "pl", STATES[2], question)
        found = {id(item): None}
        return pipeline.tokenize_items([item], found)[0]

    cold = pipeline.cost([evidence_question("Czy zwrot?")])
    with TestClient(create_app(engines, ApiSettings(metrics=True))) as client:
        plain = client.post("/v1/basal", json=body("Czy szybko?", evidence=False)).json()["usage"]
        (entry,) = [e for e in pipeline.state_cache._entries.values() if e.ready]
        assert entry.hidden is None and pipeline.cost([evidence_question("Czy zwrot?")]) == cold
        beside = [evidence_question("Czy zwrot?"), _question(pipeline, STATES[2], "Czy szybko?")]
        assert pipeline.cost(beside) == Pipeline(demo_model, backend).cost(beside)  # the state is computed anyway
        assert pipeline.cached_prefix(evidence_question("Czy zwrot?")) is None  # no hidden states: not a hit
        upgrade = client.post("/v1/basal", json=body("Czy zwrot?")).json()
        assert entry.hidden is not None
        hit = client.post("/v1/basal", json=body("Czy faktura?")).json()
        text = client.get("/metrics").text
    assert plain["cached_tokens"] == 0 and upgrade["usage"]["cached_tokens"] == 0
    assert 0 < hit["usage"]["cached_tokens"] < hit["usage"]["input_tokens"] and hit["answers"]["q"]["evidence"]
    state = len(entry.ids) - len(pipeline.prefixes["pl"])
    assert pipeline.cost([evidence_question("Czy zwrot?")]) == cold - state
    assert pipeline.cached_prefix(evidence_question("Czy zwrot?")) == (entry.key, len(entry.ids))
    model = demo_model.name
    assert f'basal_state_cache_hits_total{{model="{model}"}} 1.0' in text
    assert f'basal_state_cache_misses_total{{model="{model}"}} 2.0' in text
    assert f'basal_state_cache_bytes{{model="{model}"}} {float(entry.nbytes)}' in text
    assert entry.nbytes == backend.prefix_bytes(entry.key) + entry.hidden.nbytes


@pytest.mark.parametrize("filler_runs_first", [True, False])
def test_an_evidence_pass_beside_one_that_fills_its_state(demo_model, filler_runs_first):
    """A plain pass claims a new state; an evidence pass packed before it runs computes the state itself (it needs
    the rows' hidden states) and leaves them with the entry if the entry is filled by then, else nothing."""
    backend = TorchBackend.load(demo_model)
    pipeline = Pipeline(demo_model, backend, state_cache_mb=16)
    plain = _question(pipeline, STATES[0], "Czy szybko?")
    item = Item("q", "noul", ("Tak", "Nie"), ("Tak", "Nie"), "pl", STATES[0], "Czy zwrot?")
    evidence = pipeline.tokenize_items([item], {id(item): None})[0]
    off = run_to_end(Pipeline(demo_model, backend).letter_logits([evidence]))[0]
    first, second = pipeline.pack_questions([plain]), pipeline.pack_questions([evidence])
    (entry,) = first[0].states
    assert not second[0].states and second[0].keeps[0][0] is entry  # computes its state, keeps its rows' states
    runs = [([plain], first), ([evidence], second)]
    results = [run_to_end(pipeline.run_forwards(q, f)) for q, f in (runs if filler_runs_first else runs[::-1])]
    got = results[1 if filler_runs_first else 0][0]
    assert [x.tobytes() for x in got] == [x.tobytes() for x in off]
    assert np.asarray(got.states).tobytes() == np.asarray(off.states).tobytes()
    assert entry.ready and (entry.hidden is not None) == filler_runs_first
    assert (
        pipeline.state_cache.bytes
        == entry.nbytes
        == backend.prefix_bytes(entry.key) + (entry.hidden.nbytes if filler_runs_first else 0)
    )
