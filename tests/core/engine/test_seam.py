"""The engine drives any pipeline through the seam's calls alone, and finds each request's rows by its state.

The double below has nothing but `facts`, `admit`, `pack`, `forward` and `settle` (no model, tokenizer, backend or
prefixes to read), and its passes return every request's rows keyed by its state, in the reverse of the order
`pack` got them: a request answered with another's rows would show the engine slicing results by position."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from basal.core.engine.engine import Engine, EngineSettings
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.seam import Admitted, Answer, Facts, Next, Stats
from basal.core.packing.tree import TokenizedQuestion
from basal.core.request.limits import Limits

WAIT_S = 10


@dataclass(eq=False)
class Asked:
    """The double's state of one request: its name and how many passes it still needs."""

    name: str
    passes_left: int
    seen: list[list[str]] = field(default_factory=list)  # the rows settle got, pass after pass


@dataclass
class DoublePass:
    stats: Stats
    states: list[Asked]


class KeyedRows:
    """A pipeline double: request "name:k" needs k passes (0: none); its rows name it and the pass."""

    def __init__(self) -> None:
        self.packed: list[list[str]] = []  # the names of each pass, in the order the engine handed them over

    def facts(self) -> Facts:
        return Facts("test", None, False, {}, context=64, max_token_chars=4, prefix_tokens={})  # type: ignore[arg-type]

    def admit(self, request: str, limits: Limits | None = None, cancelled=lambda: False) -> Admitted:
        name, passes = request.split(":")
        state = Asked(name, int(passes))
        return Admitted(self._prompts(state), 3 * state.passes_left, state)

    def cached_prefix(self, question: TokenizedQuestion) -> None:
        return None

    def pack(self, states, stats=None) -> DoublePass:
        self.packed.append([s.name for s in states])
        return DoublePass(stats or Stats(), list(states))

    def forward(self, packed: DoublePass, preemptible: bool = False):
        yield  # a checkpoint, as a backend's pass has
        return {s: [f"{s.name} pass {len(s.seen) + 1}"] for s in reversed(packed.states)}

    def settle(self, state: Asked, rows, arrival: float, cancelled=lambda: False) -> Answer | Next:
        state.seen.append(list(rows))
        state.passes_left -= 1
        if state.passes_left > 0:
            return Next(self._prompts(state), 3)
        return Answer(state.seen)  # type: ignore[arg-type]

    @staticmethod
    def _prompts(state: Asked) -> list[TokenizedQuestion]:
        ids = (1, 2, 3, 10 + len(state.name))  # one short prompt per pass still to run
        return [TokenizedQuestion("en", state.name, (ids,))] if state.passes_left > 0 else []


def run_all(requests: list[str]) -> tuple[dict[str, object], KeyedRows]:
    """Every request admitted and queued before the lanes start, so that they share passes."""
    pipeline = KeyedRows()
    engine = Engine("double", pipeline, Gate(), Metrics(), EngineSettings(long_tokens=0))
    answers: dict[str, object] = {}
    done = threading.Event()

    def finisher(name: str):
        def finish(result: object) -> None:
            answers[name] = result
            if len(answers) == len(requests):
                done.set()

        return finish

    for r in requests:
        engine.submit(engine.admit(r, finisher(r.split(":")[0]), lambda: False))
    engine.start()
    assert done.wait(WAIT_S), f"answered only {sorted(answers)}"
    engine.close()
    return answers, pipeline


def test_each_request_gets_its_own_rows_when_a_pass_returns_them_out_of_order():
    answers, pipeline = run_all(["a:1", "b:1", "c:1", "d:1"])
    assert pipeline.packed == [["a", "b", "c", "d"]]  # one pass for all four
    for name in "abcd":
        answer = answers[name]
        assert isinstance(answer, Answer) and answer.response == [[f"{name} pass 1"]]


def test_a_request_with_a_next_round_re_enters_and_gets_its_rows_of_each_pass():
    answers, pipeline = run_all(["one:1", "two:2", "three:3"])
    assert pipeline.packed == [["one", "two", "three"], ["two", "three"], ["three"]]
    assert answers["one"].response == [["one pass 1"]]
    assert answers["two"].response == [["two pass 1"], ["two pass 2"]]
    assert answers["three"].response == [["three pass 1"], ["three pass 2"], ["three pass 3"]]


def test_a_request_that_asks_no_round_is_settled_at_once_with_no_rows():
    answers, pipeline = run_all(["none:0", "x:1"])
    assert answers["none"].response == [[]] and answers["x"].response == [["x pass 1"]]
    assert pipeline.packed == [["x"]]


def test_a_pass_that_leaves_a_request_out_fails_that_request_only(monkeypatch):
    """A pipeline bug (a request's rows missing from its pass) fails that request, not its neighbours."""
    forward = KeyedRows.forward

    def forgetful(self, packed, preemptible=False):
        rows = yield from forward(self, packed, preemptible)
        return {s: r for s, r in rows.items() if s.name != "b"}

    monkeypatch.setattr(KeyedRows, "forward", forgetful)
    answers, _ = run_all(["a:1", "b:1", "c:1"])
    assert isinstance(answers["b"], KeyError)
    assert answers["a"].response == [["a pass 1"]] and answers["c"].response == [["c pass 1"]]
