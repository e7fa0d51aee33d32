"""A request with a choice of 11–255 options runs in two stages: its cost counts both before it starts, its final
round re-enters its own lane after the group round, and ordinary requests batched around it are unchanged."""

from __future__ import annotations

import asyncio

import pytest

from basal.backends.cuda.backend import TorchBackend
from basal.core.engine.pipeline import Pipeline
from basal.core.request.dialects import parse_systemone
from tests.servers import make_engines

MODEL = "basal-synthetic-demo"


def large_request(n: int = 25):
    criteria = {f"k{i}": f"reason number {i}" for i in range(n)}
    body = {
        "model": MODEL,
        "state": "The parcel arrived late and damaged.",
        "questions": {"why": {"type": "choice", "instructions": "Which reason?", "criteria": criteria}},
    }
    return parse_systemone(body, lambda m: m)


def small_request(i: int):
    body = {
        "model": MODEL,
        "state": f"Order {i} is late.",
        "questions": {"q": {"type": "noul", "instructions": "Late?"}},
    }
    return parse_systemone(body, lambda m: m)


def test_cost_counts_the_final_round_before_the_work_starts(demo_model):
    engines = make_engines(demo_model)
    engine = engines.engines[MODEL]
    job = engine.admit(large_request(), print, lambda: False)
    first = engine.pipeline.cost(job.tokenized)
    estimate = engine.pipeline.cost(engine.pipeline.later_rounds_estimate(job.rounds))
    assert len(job.tokenized) == 6 and estimate > 0 and job.cost == first + estimate
    ordinary = engine.admit(small_request(0), print, lambda: False)
    assert ordinary.cost == engine.pipeline.cost(ordinary.tokenized)  # nothing added to an ordinary request


@pytest.fixture(scope="module")
def expected(demo_model):
    """Answers of the plain pipeline, each request alone."""
    plain = Pipeline(demo_model, TorchBackend.load(demo_model))
    return plain.decide(large_request()), [plain.decide(small_request(i)) for i in range(2)]


@pytest.mark.parametrize("long_tokens", [0, 1])  # main lane; everything on the preemptible long lane
def test_second_stage_re_enters_its_lane(demo_model, expected, long_tokens):
    engines = make_engines(demo_model, long_tokens=long_tokens)
    engine = engines.engines[MODEL]
    lane = engine.long if long_tokens else engine.main
    submitted = []
    submit = lane.submit
    lane.submit = lambda job: (submitted.append(len(job.tokenized)), submit(job))[1]
    engines.start()

    async def main():
        return await asyncio.gather(engines.run(large_request()), *(engines.run(small_request(i)) for i in range(2)))

    large, *small = asyncio.run(main())
    expected_large, expected_small = expected
    assert large.response.answers == expected_large.answers and large.response.usage == expected_large.usage
    assert [r.response.answers for r in small] == [r.answers for r in expected_small]
    assert sorted(submitted) == [1, 1, 1, 6]  # 2 small jobs, the group round (6 groups), the final group again
    assert engine.computed_jobs == 3 and engine.batches >= 2
    engines.close()
