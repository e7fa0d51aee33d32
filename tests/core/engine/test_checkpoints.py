"""What the engine does around the device: packs before taking it, treats every backend yield as a checkpoint,
stops a pass whose clients all left, refuses work over the character bound before tokenizing, survives a closed
event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import basal.core.engine.pipeline as pipeline_module
from basal.core.engine.gate import Holder
from basal.core.errors import Cancelled, RequestError
from basal.core.request.limits import Limits
from tests.core.engine.test_scheduling import device_held, request, timed
from tests.servers import make_engines

DEMO = "basal-synthetic-demo"


@pytest.fixture(scope="module")
def plain(demo_model):
    """Engines with the default settings (no request limit on packed tokens), started."""
    engines = make_engines(demo_model, limits=Limits(max_request_tokens=1 << 30))
    engines.start()
    yield engines
    engines.close()


def test_batch_is_packed_before_the_device_is_taken(plain, monkeypatch):
    engines = plain
    gate = engines.engines[DEMO].gate
    held_while_packing = []
    split_forwards = pipeline_module.split_forwards

    def recording(*args, **kwargs):
        held_while_packing.append(gate._held)
        return split_forwards(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "split_forwards", recording)
    asyncio.run(engines.run(request(20, 3)))
    assert held_while_packing == [False]


def test_pass_stops_at_the_next_checkpoint_when_every_client_left(demo_model):
    engines = make_engines(demo_model, slow_s=0.3, yields_per_layer=3)
    engines.start()
    engine = engines.engines[DEMO]
    backend = engine.pipeline.backend

    async def main():
        gone = threading.Event()
        backend.on_pause = lambda inside: (gone.set(), True)[1]  # the client leaves at the pass's first pause
        task = asyncio.create_task(engines.run(request(20, 2), gone.is_set))
        with pytest.raises(Cancelled):
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(main())
    layers = demo_model.config.num_hidden_layers
    assert engine.stopped_passes == 1 and engine.computed_jobs == 0
    assert backend.yields == 1 < layers * backend.yields_per_layer  # it stopped at that pause, not at the end
    assert 'outcome="stopped"' in engines.metrics.render()
    engines.close()


def test_a_batch_with_a_live_client_runs_to_the_end_with_the_same_bits(demo_model):
    engines = make_engines(demo_model, slow_s=0.05, max_batch_tokens=1 << 20)
    engines.start()
    engine = engines.engines[DEMO]
    kept_req = request(10, 2, tag="kept")
    alone = asyncio.run(engines.run(kept_req)).response

    async def main():
        gone = threading.Event()
        with device_held(engines):
            first = asyncio.create_task(engines.run(request(2, tag="first")))  # admitted alone, waits at the gate
            await asyncio.sleep(0.1)
            doomed = asyncio.create_task(engines.run(request(10, 2, tag="doomed"), gone.is_set))
            kept = asyncio.create_task(engines.run(kept_req))  # queued with doomed: one batch after `first`
            await asyncio.sleep(0.1)
        await first
        yields = engine.pipeline.backend.yields
        while engine.pipeline.backend.yields == yields:
            await asyncio.sleep(0.005)
        gone.set()  # one client leaves mid-pass: the other still waits, so the pass goes on
        await asyncio.gather(doomed, return_exceptions=True)
        result = await kept
        assert result.pass_requests == 2
        return result

    assert asyncio.run(main()).response == alone
    assert engine.stopped_passes == 0
    engines.close()


def test_every_backend_yield_is_a_checkpoint_and_bits_do_not_change(demo_model, monkeypatch):
    """Backends that step aside inside a layer (row chunks, query tiles) yield more often: the engine offers the
    device back at each of those yields, and the long request's answer stays bit for bit the same (the
    one-yield-per-layer case is `test_preempted_long_pass_gives_the_same_bits`)."""
    engines = make_engines(demo_model, slow_s=0.1, yields_per_layer=4, long_tokens=300, slice_ms=0)
    engines.start()
    backend = engines.engines[DEMO].pipeline.backend
    checkpoints = []
    checkpoint = Holder.checkpoint

    def counting(self):
        checkpoints.append(self.urgent)
        return checkpoint(self)

    monkeypatch.setattr(Holder, "checkpoint", counting)
    long_req, short_req = request(120, 4), request(2)
    before = backend.yields
    alone = asyncio.run(engines.run(long_req)).response
    assert len(checkpoints) == backend.yields - before

    async def main():
        finished: list = []
        started = backend.yields
        long_task = asyncio.create_task(timed(engines, long_req, finished, "long"))
        while backend.yields == started:  # the short one arrives once the long pass runs
            await asyncio.sleep(0.005)
        await timed(engines, short_req, finished, "short")
        return (await long_task).response, [name for name, _ in finished]

    preemptions = engines.engines[DEMO].gate.preemptions
    response, order = asyncio.run(main())
    assert response == alone and order == ["short", "long"]
    assert engines.engines[DEMO].gate.preemptions > preemptions
    engines.close()


def test_over_the_character_bound_nothing_is_tokenized(plain, demo_model, monkeypatch):
    engine = plain.engines[DEMO]
    calls = []
    monkeypatch.setattr(engine.pipeline, "tokenize_items", lambda *a, **k: calls.append(a))
    huge = request(1)
    limit = engine.prompt_char_limit
    item = huge.questions[0].item
    big = type(item)(item.name, item.type, item.keys, item.options, item.lang, "a" * (limit + 1), item.question_text)
    huge = type(huge)(huge.dialect, huge.model, (type(huge.questions[0])(huge.questions[0].kind, big),))
    with pytest.raises(RequestError) as e:
        engine.admit(huge, print, lambda: False)
    assert e.value.status == 400 and e.value.body["detail"]["error_type"] == "max_tokens_exceeded"
    assert calls == []
    assert limit == demo_model.config.max_position_embeddings * demo_model.tokenizer.max_token_chars


def test_an_answer_for_a_closed_event_loop_does_not_kill_the_lane(plain):
    """The client's event loop is gone (shutdown) when its batch finishes: the lane thread keeps serving."""
    engines = plain

    async def give_up():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engines.run(request(3, tag="orphan")), timeout=0.1)

    with device_held(engines):
        asyncio.run(give_up())  # its loop is closed before the job runs
        time.sleep(0.05)
    time.sleep(0.3)
    assert engines.engines[DEMO].main.thread.is_alive()
    result = asyncio.run(asyncio.wait_for(engines.run(request(3, tag="next")), timeout=10))
    assert result.response.answers
