"""Batch lines are background work: behind every online job of their lane, never in the same batch as one, in
arrival order (so lines of one state pack together), and on a preemptible lane that steps aside for an online
request at the next pause point once its slice is spent — shown with a deterministic gate: the online request
arrives at a pause of the batch pass, and the pass stands still at exactly that pause while it computes."""

from __future__ import annotations

import asyncio

import pytest

from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.engine.scheduler import Job, JobQueue, Policy
from basal.core.packing.tree import TokenizedQuestion
from tests.core.engine.test_scheduling import arrive_at_a_pause, request
from tests.core.engine.test_share_floor import TimedStub
from tests.servers import make_engines


def _job(prompts, background=False) -> Job:
    t = TokenizedQuestion("en", "s", tuple(prompts))
    return Job(request=None, tokenized=[t], cost=sum(map(len, prompts)), prompt_tokens=0, finish=print,
               background=background)  # fmt: skip


@pytest.mark.parametrize("policy", [Policy.HRRN, Policy.FIFO])
def test_online_jobs_go_first_and_never_share_a_batch_with_lines(policy):
    q = JobQueue(policy)
    lines = [_job([(*range(100), i)], background=True) for i in range(3)]
    online = _job([tuple(range(5000, 5400))])  # costlier than the lines: HRRN alone would put it last
    for j in (*lines, online):
        q.push(j)
    assert q.admit(100_000) == [online]
    assert q.admit(100_000) == lines  # in arrival order, together (they share their state)


def test_lines_keep_arrival_order_under_hrrn():
    q = JobQueue(Policy.HRRN)
    big, small = _job([tuple(range(900))], True), _job([tuple(range(10))], True)
    q.push(big)
    q.push(small)
    assert q.admit(50) == [big]  # HRRN would have taken the cheaper one first


@pytest.mark.parametrize("long_tokens", [4096, 0], ids=["on the long lane", "on the batch lane"])
def test_an_online_request_waits_at_most_one_pause_behind_a_batch_pass(demo_model, long_tokens):
    engines = make_engines(demo_model, slow_s=0.01, long_tokens=long_tokens, slice_ms=0)
    engines.start()
    engine = engines.engines["basal-synthetic-demo"]
    slow, gate = engine.pipeline.backend, engine.gate
    line, online = request(60, 4), request(2)
    alone = asyncio.run(engines.run(line, background=True)).response

    async def main():
        arrived: list = []
        arrive_at_a_pause(engines, online, False, asyncio.get_running_loop(), arrived)
        line_result = await engines.run(line, background=True)
        return line_result, await asyncio.wrap_future(arrived[0])

    slow.pauses.clear()
    before = gate.preemptions
    line_result, online_result = asyncio.run(main())
    assert gate.preemptions == before + 1  # the batch pass stepped aside ...
    # ... at the layer boundary where it arrived, standing still there while the online request computed
    assert any(
        not inside and resumed - paused >= online_result.compute_ms / 1000 for inside, paused, resumed in slow.pauses
    )
    assert line_result.response == alone  # and its answer keeps its bits
    engines.close()


def test_a_line_finishes_under_a_stream_of_online_requests_by_the_floor(demo_model):
    """Online requests that arrive faster than the device answers them do not starve a batch line: its lane has the
    long lane's floor (`long_share`), so it runs to the end with a bounded number of online batches overtaking it
    (with `long_share` 0 the same stream overtook it 154 times)."""
    line = request(400, 1, tag="line")
    backend = TimedStub(demo_model, short_s=0.25, step_s=0.002, long_steps=200)
    metrics, gate = Metrics(4096), Gate(slice_ms=1, long_share=0.25)
    engine = Engine(demo_model.name, Pipeline(demo_model, backend), gate, metrics, EngineSettings(long_tokens=0))
    engines = Engines({demo_model.name: engine}, demo_model.name, metrics, 4096)
    engines.start()
    alone = asyncio.run(engines.run(line, background=True)).response
    backend.shorts_during_long = 0

    async def main():
        online = [asyncio.create_task(engines.run(request(2, 1, tag="first")))]
        await asyncio.sleep(0.02)
        line_task = asyncio.create_task(engines.run(line, background=True))
        i = 0
        while not line_task.done():
            online.append(asyncio.create_task(engines.run(request(2, 1, tag=f"s{i}"))))
            i += 1
            await asyncio.sleep(0.02)
            assert i < 5_000, "the batch line did not finish under the online stream"
        await asyncio.gather(*online)
        return (await line_task).response

    assert asyncio.run(main()) == alone
    engines.close()
    assert 1 <= backend.shorts_during_long < 20 and gate.preemptions >= 1  # overtaken, but a bounded number of times
