"""Shadow traffic: the primary's answers untouched and never delayed by its shadow (a stalled shadow, a full queue),
drops counted, and agreement numbers equal to an independent computation over the same requests."""

from __future__ import annotations

import asyncio
import json

import msgspec
import numpy as np
import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from basal.core.decision.answers import BasalChoiceAnswer, MultiAnswer, NoulAnswer
from basal.core.engine.shadow import Shadow, ShadowFront, compare
from basal.core.request.dialects import parse_systemone
from basal.core.request.model_names import ServedModels
from basal.serve.config import ConfigError, parse_config
from tests.cascade_models import QUESTIONS, two_engines

STATES = [f"Ticket {i}: my payouts have failed {i} times and support does not answer." for i in range(6)]
ASKED = {k: v for k, v in QUESTIONS.items() if k != "topics"}  # choice, noul and score: one distribution each


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    front = two_engines(tmp_path_factory.mktemp("models"))
    yield front
    front.close()


def _requests(front, model: str):
    resolve = ServedModels(tuple(front.names), front.default)
    return [parse_systemone({"model": model, "state": s, "questions": ASKED}, resolve) for s in STATES]


def test_compare_reads_each_types_decision():
    c = compare(
        "q",
        "choice",
        BasalChoiceAnswer("a", {"a": 0.6, "b": 0.4}, 0.6),
        BasalChoiceAnswer("b", {"a": 0.3, "b": 0.7}, 0.7),
    )
    assert (c.primary, c.shadow, c.agree) == ("a", "b", False) and c.abs_dp == pytest.approx(0.3)
    n = compare("q", "noul", NoulAnswer(0.5), NoulAnswer(0.49))
    assert (n.primary, n.shadow) == ("true", "false") and n.abs_dp == pytest.approx(0.01)
    m = compare(
        "q",
        "multi",
        MultiAnswer(["x"], {"x": 0.9, "y": 0.2}, 0.5, 0.7),
        MultiAnswer(["x"], {"x": 0.8, "y": 0.45}, 0.5, 0.6),
    )
    assert m.agree and m.abs_dp == pytest.approx(0.25)


def test_agreement_equals_an_independent_computation_and_the_primary_is_untouched(engines):
    front = ShadowFront(engines, [Shadow("small", "large", sample=1.0)])

    async def go():
        primary = [await front.run(r) for r in _requests(front, "small")]
        await front.settle()
        return primary

    primary = asyncio.run(go())
    plain = [asyncio.run(engines.run(r)) for r in _requests(engines, "small")]
    large = [asyncio.run(engines.run(r)) for r in _requests(engines, "large")]
    for a, b in zip(primary, plain, strict=True):  # the primary's bytes with the shadow on equal those without it
        assert msgspec.json.encode(a.response) == msgspec.json.encode(b.response)

    expected: dict[str, list[tuple[bool, float]]] = {}
    for p, s in zip(plain, large, strict=True):  # from the answers' JSON, without the shadow module
        pa, sa = (
            json.loads(msgspec.json.encode(p.response))["answers"],
            json.loads(msgspec.json.encode(s.response))["answers"],
        )
        for name, spec in ASKED.items():
            if spec["type"] == "noul":
                pd, sd = pa[name]["noul"] >= 0.5, sa[name]["noul"] >= 0.5
                dp = abs(pa[name]["noul"] - sa[name]["noul"])
            else:
                pp, sp = pa[name]["probabilities"], sa[name]["probabilities"]
                pd, sd = max(pp, key=pp.get), max(sp, key=sp.get)
                dp = abs(pp[pd] - sp[pd])
            expected.setdefault(spec["type"], []).append((pd == sd, dp))
    summary = front.summary()["shadows"][0]
    assert summary["requests"] == {"sampled": 6, "compared": 6, "dropped": 0, "failed": 0}
    for kind, rows in expected.items():
        got = summary["types"][kind]
        assert got["compared"] == len(rows)
        assert got["agreement"] == sum(a for a, _ in rows) / len(rows)
        assert got["mean_abs_dp"] == pytest.approx(np.mean([d for _, d in rows]), abs=1e-12)
        assert got["p99_abs_dp"] == pytest.approx(np.quantile([d for _, d in rows], 0.99), abs=1e-12)
    flips = sum(not a for rows in expected.values() for a, _ in rows)
    assert sum(q["flips"] for q in summary["top_flipping_questions"]) == flips


class Stalled:
    """The wrapped front, with the shadow model held at a gate until the test opens it."""

    def __init__(self, inner):
        self.inner, self.gate, self.waiting = inner, asyncio.Event(), 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def run(self, request, cancelled=lambda: False, *, has_slot=False, background=False):
        if request.model == "large":
            assert background and has_slot  # behind online work, holding no max_inflight place
            self.waiting += 1
            await self.gate.wait()
        return await self.inner.run(request, cancelled, has_slot=has_slot, background=background)


def test_a_stalled_shadow_never_delays_the_primary_and_a_full_queue_drops(engines):
    async def go():
        stalled = Stalled(engines)
        front = ShadowFront(stalled, [Shadow("small", "large", sample=1.0, queue=2)])
        primary = [await front.run(r) for r in _requests(front, "small")]  # every primary answered ...
        await asyncio.sleep(0.05)
        waiting = stalled.waiting  # ... while its shadows are held at the gate
        stalled.gate.set()
        await front.settle()
        return primary, waiting, front.summary()["shadows"][0]["requests"]

    before = _series(engines, "basal_shadow_dropped_total")
    primary, waiting, counts = asyncio.run(go())
    assert len(primary) == 6 and waiting == 2
    assert counts == {"sampled": 6, "compared": 2, "dropped": 4, "failed": 0}
    assert _series(engines, "basal_shadow_dropped_total") - before == 4


def test_batch_lines_and_unsampled_requests_are_not_copied(engines):
    draws = iter([0.5, 0.05])
    front = ShadowFront(engines, [Shadow("small", "large", sample=0.1)], draw=lambda: next(draws))
    requests = _requests(front, "small")

    async def go():
        await front.run(requests[0], background=True)  # a batch line: never shadowed, no draw taken
        await front.run(requests[1])  # 0.5: not sampled
        await front.run(requests[2])  # 0.05: sampled
        await front.settle()

    asyncio.run(go())
    assert front.summary()["shadows"][0]["requests"]["sampled"] == 1


def _series(engines, name: str) -> float:
    total = 0.0
    for line in engines.metrics.render().splitlines():
        if line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_get_shadow_over_http(engines):
    class Kept:  # this app's shutdown leaves the module's engines running
        def __getattr__(self, name):
            return getattr(engines, name)

        def close(self, *args, **kwargs) -> None:
            pass

    front = ShadowFront(Kept(), [Shadow("small", "large", sample=1.0)])
    with TestClient(create_app(front, ApiSettings(api_keys=("k",)), shadow=front)) as c:
        auth = {"authorization": "Bearer k"}
        assert (
            c.post(
                "/v1/systemone", json={"model": "small", "state": STATES[0], "questions": ASKED}, headers=auth
            ).status_code
            == 200
        )
        assert c.get("/v1/shadow").status_code == 403
        for _ in range(100):  # the copy runs after the answer: poll until it is compared
            body = c.get("/v1/shadow", headers=auth).json()
            if body["shadows"][0]["requests"]["compared"]:
                break
        assert body["shadows"][0]["model"] == "small" and body["shadows"][0]["shadow"] == "large"
        assert set(body["shadows"][0]["types"]) == {"choice", "noul", "score"}
    with TestClient(create_app(Kept())) as c:
        assert c.get("/v1/shadow").status_code == 404


def test_the_configuration_reads_a_shadow_and_refuses_bad_ones():
    config = parse_config({"models": [{"path": "demo", "shadow": {"model": "other", "sample": 0.25}}]})
    assert config.models[0].shadow.sample == 0.25 and config.models[0].shadow.queue == 64
    for bad, message in (
        ({"model": "o", "sample": 1.5}, "sample` must be at most 1"),
        ({"model": "o", "queue": 0}, "queue` must be at least 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config({"models": [{"path": "demo", "shadow": bad}]})
