"""Scheduling: lanes, the gate, HRRN vs FIFO, admission by budget, cancellation and overload."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager

import pytest

from basal.core.engine.scheduler import Job, JobQueue, Policy
from basal.core.errors import Cancelled, EngineClosed, Overloaded
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.dialects import parse_systemone
from tests.servers import make_engines


def request(state_words: int, n_questions: int = 1, tag: str = ""):
    body = {
        "model": "basal-synthetic-demo",
        "state": " ".join(["order late damaged refund"] * state_words),
        "questions": {
            f"q{i}{tag}": {"type": "noul", "instructions": f"Is {i} {tag} true?"} for i in range(n_questions)
        },
    }
    return parse_systemone(body, lambda m: m)


@contextmanager
def device_held(engines):
    """Hold the shared gate from the test, so lanes queue up behind it."""
    release, held = threading.Event(), threading.Event()

    def hold():
        with engines.engines["basal-synthetic-demo"].gate.hold(urgent=True):
            held.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    try:
        yield
    finally:
        release.set()
        t.join()


async def timed(engines, req, finished: list, name: str, delay: float = 0.0):
    await asyncio.sleep(delay)
    result = await engines.run(req)
    finished.append((name, time.perf_counter()))
    return result


def arrive_at_a_pause(engines, request_, inside: bool, loop, arrived: list) -> None:
    """Submit `request_` from the long lane's thread at its next pause inside a layer (inside=True) or at a layer
    boundary, and hold that pause until the request waits for the device: the long pass then meets a waiting
    main lane at exactly that kind of pause point, however slow the machine is."""
    engine = engines.engines["basal-synthetic-demo"]

    def hook(at_inside: bool) -> bool:
        if at_inside != inside:
            return False
        arrived.append(asyncio.run_coroutine_threadsafe(engines.run(request_), loop))
        deadline = time.monotonic() + 20
        while not engine.gate.urgent_waiting() and time.monotonic() < deadline:
            time.sleep(0.001)
        return True

    engine.pipeline.backend.on_pause = hook


def test_short_request_overtakes_a_long_one_on_the_long_lane(demo_model):
    engines = make_engines(demo_model, slow_s=0.05, long_tokens=300, slice_ms=0)
    engines.start()
    long_req, short_req = request(120, 4), request(2)
    assert engines.engines["basal-synthetic-demo"].admit(long_req, print, lambda: False).cost > 300

    async def main():
        arrived: list = []
        arrive_at_a_pause(engines, short_req, False, asyncio.get_running_loop(), arrived)
        long_task = asyncio.ensure_future(engines.run(long_req))
        while not arrived:
            await asyncio.sleep(0.01)
        return await asyncio.wrap_future(arrived[0]), await long_task

    short_result, long_result = asyncio.run(main())
    assert short_result.response.answers and long_result.response.answers
    # the long pass stepped aside for the short one, which had arrived after it started
    assert engines.engines["basal-synthetic-demo"].gate.preemptions >= 1
    engines.close()


@pytest.mark.parametrize("inside", [False, True], ids=["between layers", "inside a layer"])
def test_preempted_long_pass_gives_the_same_bits(demo_model, inside):
    """Every pause point is a checkpoint, between layers and inside one (between row chunks and key-tile spans):
    a short request that arrives there runs at that pause — the long pass stands still for its whole compute — and
    the long one's answer keeps its bits."""
    engines = make_engines(demo_model, slow_s=0.01, slow_in_layer=inside, long_tokens=300, slice_ms=0)
    engines.start()
    engine = engines.engines["basal-synthetic-demo"]
    slow, gate = engine.pipeline.backend, engine.gate
    long_req, short_req = request(120, 4), request(2)
    alone = asyncio.run(engines.run(long_req)).response
    assert any(at_inside == inside for at_inside, _, _ in slow.pauses)  # the pass has such pause points

    async def main():
        arrived: list = []
        arrive_at_a_pause(engines, short_req, inside, asyncio.get_running_loop(), arrived)
        long_result = await engines.run(long_req)
        return long_result, await asyncio.wrap_future(arrived[0])

    slow.pauses.clear()
    before = gate.preemptions
    long_result, short_result = asyncio.run(main())
    assert long_result.response == alone
    assert gate.preemptions == before + 1
    assert any(
        at_inside == inside and resumed - paused >= short_result.compute_ms / 1000
        for at_inside, paused, resumed in slow.pauses
    )
    engines.close()


@pytest.mark.parametrize("policy", ["fifo", "hrrn"])
def test_queue_order(demo_model, policy):
    engines = make_engines(demo_model, schedule=Policy(policy), max_batch_tokens=1, long_tokens=0)
    engines.start()
    sizes = [60, 5, 30, 1, 15]  # arrival order; FIFO keeps it, HRRN runs the shortest first

    async def main():
        finished: list = []
        with device_held(engines):
            tasks = []
            for i, words in enumerate(sizes):
                tasks.append(asyncio.create_task(timed(engines, request(words, tag=str(i)), finished, str(i))))
                if policy == "fifo":
                    await asyncio.sleep(0.02)  # a clear arrival order
            await asyncio.sleep(0.2)  # HRRN: all waited about as long, so the estimated cost decides
        await asyncio.gather(*tasks)
        return [int(name) for name, _ in finished]

    order = asyncio.run(main())
    engines.close()
    if policy == "fifo":
        assert order == [0, 1, 2, 3, 4]
    else:  # the first one planned was admitted at once and waited at the gate; then shortest first
        assert [sizes[i] for i in order[1:]] == sorted(sizes[i] for i in order[1:])


def test_hrrn_does_not_starve_a_long_request(demo_model):
    """A steady stream of short requests keeps the lane busy; HRRN still runs the long one while they arrive."""
    engines = make_engines(demo_model, slow_s=0.02, max_batch_tokens=400, long_tokens=0)
    engines.start()
    long_req = request(60, 3)
    assert engines.engines["basal-synthetic-demo"].admit(long_req, print, lambda: False).cost > 400  # runs alone

    async def main():
        finished: list = []
        stop = asyncio.Event()
        shorts = []

        async def stream():
            i = 0
            while not stop.is_set():
                shorts.append(asyncio.create_task(timed(engines, request(2, tag=f"s{i}"), finished, f"s{i}")))
                i += 1
                await asyncio.sleep(0.05)

        feeder = asyncio.create_task(stream())
        await asyncio.sleep(0.3)
        await asyncio.wait_for(timed(engines, long_req, finished, "long"), timeout=20)
        shorts_before_stop = len(shorts)
        await asyncio.sleep(0.2)
        stop.set()
        await feeder
        await asyncio.gather(*shorts)
        names = [name for name, _ in finished]
        return names.index("long"), len(names), shorts_before_stop

    position, total, _ = asyncio.run(main())
    engines.close()
    assert position < total - 2  # shorts that arrived after it were still answered after it


def test_cancelled_request_is_never_computed(demo_model):
    engines = make_engines(demo_model)
    engines.start()
    engine = engines.engines["basal-synthetic-demo"]

    async def main():
        gone = threading.Event()
        with device_held(engines):
            doomed = asyncio.create_task(engines.run(request(3, tag="doomed"), gone.is_set))
            kept = asyncio.create_task(engines.run(request(3, tag="kept")))
            await asyncio.sleep(0.1)
            gone.set()  # the client disconnects while both wait for the device
        with pytest.raises(Cancelled):
            await doomed
        return await kept

    computed_before = engine.computed_jobs
    asyncio.run(main())
    assert engine.cancelled_jobs == 1 and engine.computed_jobs == computed_before + 1
    engines.close()


def test_overload(demo_model):
    engines = make_engines(demo_model, max_inflight=2)
    engines.start()

    async def main():
        with device_held(engines):
            waiting = [asyncio.create_task(engines.run(request(2, tag=str(i)))) for i in range(2)]
            await asyncio.sleep(0.1)
            with pytest.raises(Overloaded):
                await engines.run(request(2, tag="x"))
        await asyncio.gather(*waiting)
        await engines.run(request(2, tag="after"))  # capacity is back

    asyncio.run(main())
    engines.close()


def _job(prompts, lang="en", cost=None):
    t = TokenizedQuestion(lang, "s", tuple(prompts))
    return Job(request=None, tokenized=[t], cost=cost or sum(map(len, prompts)), prompt_tokens=0, finish=print)


def test_admission_counts_shared_prefixes_once_and_runs_oversized_alone():
    q = JobQueue(Policy.FIFO)
    shared = tuple(range(100))
    a = _job([(*shared, 1), (*shared, 2)])
    b = _job([(*shared, 3), (*shared, 4)])  # shares the 100-token state with a
    c = _job([tuple(range(500, 700))])
    for j in (a, b, c):
        q.push(j)
    assert q.admit(120) == [a, b]  # 102 + 2 tokens: b adds only its own suffixes
    assert q.admit(120) == [c]  # larger than the budget: runs alone
    assert len(q) == 0


def test_hrrn_priority_grows_with_waiting():
    q = JobQueue(Policy.HRRN)
    now = 100.0
    long, short = _job([tuple(range(3000))]), _job([tuple(range(30))])
    long.arrival, short.arrival = now - 10.0, now
    assert q.priority(long, now) < q.priority(short, now)  # waited 10 s at 3000 tok/s: ratio 11 vs 1
    long.arrival = short.arrival = now - 0.1  # equal waits: the cheaper one first (and on a tie of ratios too)
    assert q.priority(short, now) < q.priority(long, now)
    long.arrival = short.arrival = now
    assert q.priority(short, now) < q.priority(long, now)
    q.observe(6000, 1.0)
    assert q.rate == pytest.approx(0.8 * 3000 + 0.2 * 6000)
    q.observe(10, 0.0005)  # under 1 ms: ignored
    assert q.rate == pytest.approx(3600)


@pytest.mark.parametrize("drain", [True, False])
def test_graceful_shutdown(demo_model, drain):
    """Shutdown finishes what is queued (drain) or fails it cleanly; nothing hangs, nothing is half-answered."""
    engines = make_engines(demo_model, max_batch_tokens=1)
    engines.start()

    async def main():
        with device_held(engines):
            tasks = [asyncio.create_task(engines.run(request(2, tag=str(i)))) for i in range(4)]
            await asyncio.sleep(0.1)
            closer = threading.Thread(target=engines.close, kwargs={"drain": drain, "timeout": 30})
            closer.start()
            await asyncio.sleep(0.1)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        closer.join()
        with pytest.raises(EngineClosed):
            await engines.run(request(2, tag="late"))
        return results

    results = asyncio.run(main())
    if drain:
        assert all(not isinstance(r, BaseException) for r in results)
    else:  # the batch already waiting at the device finishes; the queued rest fail with a clear error
        assert not isinstance(results[0], BaseException)
        assert all(isinstance(r, EngineClosed) for r in results[1:])
