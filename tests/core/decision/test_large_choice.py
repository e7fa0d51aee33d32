"""Choices with 11–255 options (docs/extensions.md §7): every visible large_choice vector that runs without the real
weights (groups, prompt counts, finalists, the Luce fit, the whole pipeline through a stub backend), and the
property that the fit reproduces exact Luce targets."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basal.core.decision.large_choice import LargeChoice, blocks, finalists, groups, prompt_count, sub_item
from basal.core.decision.luce import fit
from basal.core.engine.pipeline import Pipeline, Stats
from basal.core.engine.rounds import Rounds
from basal.core.model.model_dir import Calibration
from basal.core.model.prompt import Item, option_orders
from basal.core.request.dialects import parse_systemone
from tests.conftest import DATA
from tests.stub_backend import FakeBackend

VECTORS = [json.loads(line) for line in (DATA / "extensions" / "large_choice.jsonl").read_text().splitlines() if line]


def vectors(kind: str) -> list[dict]:
    found = [v for v in VECTORS if v["kind"] == kind]
    assert found, kind
    return found


def ids(vs: list[dict]) -> list[str]:
    return [v["id"] for v in vs]


@pytest.mark.parametrize("v", vectors("groups"), ids=ids(vectors("groups")))
def test_groups(v):
    assert groups(v["n"]) == v["expected"]["groups"]
    assert [len(b) for b in blocks(v["n"])] == v["expected"]["block_sizes"]
    assert len(blocks(v["n"])) == v["expected"]["g"]


@pytest.mark.parametrize("n", [11, 23, 59, 99, 101, 150, 254, 255])
def test_groups_cover_every_option_twice_in_at_most_10(n):
    gs = groups(n)
    counts = np.bincount([i for g in gs for i in g], minlength=n)
    assert len(gs) == 2 * -(-n // 10) and all(len(g) <= 10 for g in gs) and set(counts) == {2}
    assert all(g == sorted(g) for g in gs)  # original relative order inside every group


@pytest.mark.parametrize("v", vectors("prompt_count"), ids=ids(vectors("prompt_count")))
def test_prompt_count(v):
    assert prompt_count(v["n"], v["strategy"]) == v["expected"]["prompts"]
    keys = tuple(f"o{i}" for i in range(v["n"]))
    lc = LargeChoice(Item("q", "choice", keys, keys, "en", "s", "?"), v["strategy"])
    first = lc.first_round()
    assert len(first) == v["expected"]["first_round_groups"]
    assert {len(g.orders) for g in first} == {v["expected"]["first_round_orders"]}


@pytest.mark.parametrize(("n", "prompts"), [(59, 14), (77, 18), (150, 32), (255, 54)])
def test_default_prompt_counts_of_the_spec(n, prompts):
    assert prompt_count(n) == prompts


@pytest.mark.parametrize("v", vectors("finalists"), ids=ids(vectors("finalists")))
def test_finalists(v):
    assert finalists(v["p"]) == v["expected"]


def test_finalists_are_the_strongest_in_original_order():
    p = np.linspace(0.0, 1.0, 30)[::-1].copy()
    p[[3, 17]] = 5.0
    assert finalists(p) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 17]


@pytest.mark.parametrize("v", vectors("fit_joint"), ids=ids(vectors("fit_joint")))
def test_fit_joint(v):
    joint = fit(v["n"], v["groups"], v["targets"])
    assert np.max(np.abs(joint - np.asarray(v["expected"]))) <= v["tolerance"]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(11, 120), seed=st.integers(0, 2**32 - 1), spread=st.floats(0.1, 2.0))
def test_fit_reproduces_exact_luce_targets(n, seed, spread):
    """Targets that are group-restricted softmaxes of a hidden θ: the maximum-likelihood fit is softmax(θ).

    θ ~ N(0, spread²) with spread ≤ 2 (ratios up to ~e^16). Much wider spreads are recovered less exactly, by the
    rule itself: when two strong options are linked only through options of p ~ 1e-15, |grad| < 1e-10 and the
    1e-9 ridge stop the fit a few 1e-6 away (n = 11, spread 6: 4.5e-6)."""
    theta = np.random.default_rng(seed).normal(0.0, spread, n)
    truth = np.exp(theta - theta.max())
    truth /= truth.sum()
    gs = groups(n)
    targets = [truth[g] / truth[g].sum() for g in gs]
    assert np.max(np.abs(fit(n, gs, targets) - truth)) < 1e-9


def test_fit_of_uniform_groups_is_uniform():
    gs = groups(40)
    assert np.allclose(fit(40, gs, [np.full(len(g), 1 / len(g)) for g in gs]), 1 / 40, atol=1e-15)


# ---------------------------------------------------------------------------------------------------------------
# The pipeline vector, end to end: a stub backend answers every prompt with the recorded letter probabilities.


class RecordedBackend(FakeBackend):
    """Answers a prompt with the letter logits log(p) recorded for its exact token ids; any other prompt fails."""

    name, device, dtype = "recorded", "cpu", "f64"

    def __init__(self, table: dict[tuple[int, ...], Sequence[float]]):
        self.table = table
        self.prefixes: dict[str, tuple[int, ...]] = {}
        self.asked: list[tuple[int, ...]] = []

    def prefix(self, key, tokens):
        self.prefixes[key] = tuple(tokens)

    def run(self, batch, prepared=None, preemptible=False):
        rows = []
        for r in batch.readouts:
            chain = batch.chain(int(batch.block_of[r]))
            cached = int(batch.block_prefix[chain[0]])
            prompt = list(self.prefixes[batch.prefix_keys[cached]]) if cached >= 0 else []
            for b in chain:
                start = int(batch.block_start[b])
                end = int(r) + 1 if b == chain[-1] else start + int(batch.block_len[b])
                prompt += batch.tokens[start:end].tolist()
            self.asked.append(tuple(prompt))
            p = np.asarray(self.table[tuple(prompt)], dtype=np.float64)
            row = np.full(len(batch.letter_ids), -30.0)  # float64: the recorded values, unrounded
            row[: len(p)] = np.log(p)
            rows.append(row)
        yield
        return np.stack(rows)


def _pipeline_vector():
    (v,) = vectors("large_choice_pipeline")
    return v


def _recorded_pipeline(demo_model, v, request_item: Item) -> tuple[Pipeline, RecordedBackend]:
    """Table of every prompt of the vector's rounds -> its recorded letter probabilities (by letter position)."""
    model = dataclasses.replace(demo_model, calibration=Calibration({"choice": v["temperature_choice"]}))
    tok = model.tokenizer
    table: dict[tuple[int, ...], Sequence[float]] = {}
    for k, (g, p) in enumerate(zip(v["first_round"]["groups"], v["first_round"]["p_avg"], strict=True)):
        item = sub_item(request_item, g, f"q#{k}", 1)
        table[tuple(tok.encode(item.prompt(item.orders[0], model.bos)))] = p
    final = sub_item(request_item, v["expected"]["finalists"], "q#final", 2)
    for perm in option_orders(len(final.options)):
        table[tuple(tok.encode(final.prompt(perm, model.bos)))] = [v["final_round_p_avg"][i] for i in perm]
    backend = RecordedBackend(table)
    return Pipeline(model, backend), backend


def _request(n: int) -> dict:
    criteria = {f"o{i}": f"option number {i}" for i in range(n)}
    return {"model": "m", "state": "A customer writes.", "questions": {"q": {"type": "choice", "criteria": criteria}}}


def test_pipeline_vector_through_the_math():
    v = _pipeline_vector()
    keys = tuple(f"o{i}" for i in range(v["n"]))
    lc = LargeChoice(Item("q", "choice", keys, keys, "en", "s", "?"), v["strategy"])
    assert lc.groups == v["first_round"]["groups"]
    final = lc.take_first_round(v["first_round"]["p_avg"])
    assert np.max(np.abs(lc.first_fit - v["expected"]["first_fit"])) <= v["tolerance"]
    assert lc.finalists == v["expected"]["finalists"] and final.keys == tuple(f"o{i}" for i in lc.finalists)
    joint = lc.take_final_round(v["final_round_p_avg"])
    assert np.max(np.abs(joint - v["expected"]["joint"])) <= v["tolerance"]


def test_pipeline_vector_end_to_end(demo_model):
    """Pipeline.decide on the TypeSafe request: answer, option order, rounds asked, usage."""
    v = _pipeline_vector()
    request = parse_systemone(_request(v["n"]), lambda _: "m")
    pipeline, backend = _recorded_pipeline(demo_model, v, request.questions[0].item)
    stats = Stats()
    response = pipeline.decide(request, stats)
    want = v["expected"]["answer_typesafe"]
    answer = response.answers["q"]
    assert answer.choice == want["choice"]
    assert list(answer.probabilities) == list(want["probabilities"])  # the request's option order
    got, expected = np.array(list(answer.probabilities.values())), np.array(list(want["probabilities"].values()))
    assert np.max(np.abs(got - expected)) <= v["tolerance"]
    assert abs(answer.confidence - want["confidence"]) <= v["tolerance"]
    assert np.max(np.abs(got - v["expected"]["p_cal"])) <= v["tolerance"]
    assert len(backend.asked) == prompt_count(v["n"], v["strategy"]) == len(set(backend.asked))  # 6 groups + 2
    assert response.usage.input_tokens == sum(map(len, backend.asked)) == stats.prompt_tokens
    assert stats.forwards == 2  # group round, then the final round


def test_rounds_keep_ordinary_questions_in_the_first_pass(demo_model):
    body = _request(20)  # groups of 10 only: uniform group answers fit a uniform joint
    body["questions"] = {"a": {"type": "noul", "instructions": "Late?"}, **body["questions"]}
    body["questions"]["b"] = {"type": "choice", "criteria": {"x": None, "y": None}}
    request = parse_systemone(body, lambda _: "m")
    rounds = Rounds(request, "luce2")
    assert [it.name for it in rounds.asked] == ["a", "b", *[f"q#{k}" for k in range(4)]]
    assert all(len(it.orders) == 2 for it in rounds.asked)
    rounds.take([[np.zeros(10, np.float32)] * len(it.orders) for it in rounds.asked])
    assert set(rounds.plain_logits) == {"a", "b"} and [it.name for it in rounds.asked] == ["q#final"]
    assert rounds.asked[0].keys == tuple(f"o{i}" for i in range(10))  # uniform first fit: ties -> lowest index
    rounds.take([[np.zeros(10, np.float32)] * 2])
    assert rounds.done and np.allclose(rounds.joints()["q"], 1 / 20)


def test_an_ordinary_request_is_one_round(demo_model):
    body = _request(10)
    rounds = Rounds(parse_systemone(body, lambda _: "m"))
    assert not rounds.large and [it.name for it in rounds.asked] == ["q"]
    rounds.take([[np.zeros(10, np.float32)] * 2])
    assert rounds.done and rounds.joints() == {}


def test_large_choice_bounds():
    keys = tuple(f"o{i}" for i in range(256))
    with pytest.raises(ValueError, match=r"11\.\.255"):
        LargeChoice(Item("q", "choice", keys, keys, "en", "s", "?"))


def test_a_client_that_left_stops_the_fits_between_rounds():
    from basal.core.errors import Cancelled

    rounds = Rounds(parse_systemone(_request(40), lambda _: "m"))
    logits = [[np.linspace(0, 1, 10, dtype=np.float32)] * len(it.orders) for it in rounds.asked]
    with pytest.raises(Cancelled):
        rounds.take(logits, cancelled=lambda: True)
