"""One model, end to end and synchronous: plan -> tokenize -> pack -> forward -> decide -> answer.

The engine (scheduler, lanes) uses the same pieces; `Pipeline.decide` is the plain path used by
`basal decide`, the tests and the in-process benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np

from basal.core.compute import Backend, run_to_end
from basal.core.contract import (
    BasalResponse,
    BasalUsage,
    DecisionRequest,
    Question,
    SystemOneResponse,
    Usage,
)
from basal.core.decision import (
    Distribution,
    answer_act,
    answer_basal,
    answer_multi,
    answer_systemone,
    calibrate,
    certain,
    distribution,
)
from basal.core.large_choice import DEFAULT_STRATEGY, FINALISTS, Strategy, sub_item
from basal.core.model_dir import ModelDir
from basal.core.model_names import ServedModels
from basal.core.multi_act_contract import evidence_refusal_basal
from basal.core.prompt import LETTERS, Item, template_prefix
from basal.core.rounds import Rounds
from basal.core.tree import (
    FORWARD_MAX_TOKENS,
    TREE_MAX_TOKENS,
    Forward,
    TokenizedQuestion,
    packed_tokens,
    plan_forwards,
)


def model_resolver(served: Sequence[str], default: str) -> ServedModels:
    """Requested model name -> served name: a served name, a Jev alias (-> default model), None -> default."""
    return ServedModels(tuple(served), default)


@dataclass
class Stats:
    """Where the time went, and what packing saved."""

    tokenize_ms: float = 0.0
    pack_ms: float = 0.0
    forward_ms: float = 0.0
    forwards: int = 0
    packed_tokens: int = 0  # tokens computed (shared prefixes once, cached template prefix not at all)
    prompt_tokens: int = 0  # tokens of every option-order prompt, as if each ran alone


class Pipeline:
    def __init__(
        self,
        model: ModelDir,
        backend: Backend,
        prefix_cache: bool = True,
        tree_max_tokens: int = TREE_MAX_TOKENS,
        forward_max_tokens: int = FORWARD_MAX_TOKENS,
        share_across_questions: bool = True,
        large_choice: Strategy = DEFAULT_STRATEGY,
    ):
        self.model = model
        self.large_choice = large_choice  # strategy for choices with 11..255 options
        self.backend = backend
        self.tokenizer = model.tokenizer
        self.letter_ids = self.tokenizer.letter_ids(len(LETTERS))
        self.tree_max_tokens = tree_max_tokens
        self.forward_max_tokens = forward_max_tokens
        self.share_across_questions = share_across_questions
        self.prefixes: dict[str, tuple[int, ...]] = {}
        if prefix_cache:
            for lang, n in self.tokenizer.prefix_len.items():
                ids = tuple(self.tokenizer.encode(template_prefix(lang, model.bos))[:n])
                backend.prefix(lang, ids)
                self.prefixes[lang] = ids

    def tokenize(self, questions: Sequence[Question]) -> list[TokenizedQuestion]:
        """Token ids of every option order of every readout the questions ask (a multi: one per label).

        The branches of a multi are separate entries about the same state, so the packer places them next to
        each other in one trie row (the state is computed once) and may cut rows between them."""
        return self.tokenize_items([item for q in questions for item in q.asked])

    def tokenize_items(self, items: Sequence[Item]) -> list[TokenizedQuestion]:
        """Token ids of every asked option order of each item."""
        prompts = [item.prompt(perm, self.model.bos) for item in items for perm in item.orders]
        ids = iter(self.tokenizer.encode_batch(prompts))
        return [
            TokenizedQuestion(item.lang, item.state_text, tuple(tuple(next(ids)) for _ in item.orders))
            for item in items
        ]

    # -- rounds: a request whose later prompts depend on earlier answers (choices with 11..255 options) ------

    def plan(self, request: DecisionRequest) -> Rounds:
        """The request's rounds, the first one tokenized."""
        rounds = Rounds(request, self.large_choice)
        rounds.tokenized = self.tokenize_items(rounds.asked)
        return rounds

    def advance(self, rounds: Rounds, logits: Sequence[list[np.ndarray]]) -> None:
        """Hand a round's letter logits back; tokenize the next round, if there is one."""
        rounds.take(logits)
        if not rounds.done:
            rounds.tokenized = self.tokenize_items(rounds.asked)

    def later_rounds_estimate(self, rounds: Rounds) -> list[TokenizedQuestion]:
        """Stand-ins for the final rounds before they are known: each large choice's 10 longest options (by
        characters), in both orders. Their cost and length bound the real final group's closely."""
        stand_ins = []
        for lc in rounds.large.values():
            options = lc.item.options
            longest = sorted(sorted(range(len(options)), key=lambda i: (-len(options[i]), i))[:FINALISTS])
            stand_ins.append(sub_item(lc.item, longest, f"{lc.item.name}#final", 2))
        return self.tokenize_items(stand_ins)

    def respond(self, rounds: Rounds, latency_ms: float) -> SystemOneResponse | BasalResponse:
        """The response of a request whose rounds have all been run."""
        return self.answer(rounds.request, rounds.plain_logits, rounds.input_tokens, latency_ms, rounds.joints())

    def cost(self, tokenized: Sequence[TokenizedQuestion]) -> int:
        """Packed tokens of a set of questions, shared prefixes counted once (the scheduler's budget unit)."""
        total = 0
        for lang in {t.lang for t in tokenized}:
            prompts = [p for t in tokenized if t.lang == lang for p in t.prompts]
            total += packed_tokens(prompts, len(self.prefixes.get(lang, ())))
        return total

    def letter_logits(
        self, tokenized: Sequence[TokenizedQuestion], stats: Stats | None = None
    ) -> Generator[None, None, list[list[np.ndarray]]]:
        """Letter logits of every order of every question (float32, first k letters); yields between layers."""
        forwards = self.pack(tokenized, stats)
        return (yield from self.forward(tokenized, forwards, stats))

    def pack(self, tokenized: Sequence[TokenizedQuestion], stats: Stats | None = None) -> list[Forward]:
        """Trie rows and forwards of a batch: host work, done before the device is taken."""
        t0 = time.perf_counter()
        forwards = plan_forwards(
            tokenized,
            self.letter_ids,
            self.prefixes,
            self.tree_max_tokens,
            self.forward_max_tokens,
            share_across_questions=self.share_across_questions,
        )
        if stats is not None:
            stats.pack_ms += (time.perf_counter() - t0) * 1000
        return forwards

    def forward(
        self, tokenized: Sequence[TokenizedQuestion], forwards: Sequence[Forward], stats: Stats | None = None
    ) -> Generator[None, None, list[list[np.ndarray]]]:
        """Run packed forwards; every yield of the backend is passed on (a point where the pass may pause)."""
        t1 = time.perf_counter()
        out: list[list[np.ndarray]] = [[None] * len(t.prompts) for t in tokenized]  # type: ignore[list-item]
        for f in forwards:
            logits = yield from self.backend.run(f.batch)
            for (qi, order), row in f.readout_of.items():
                out[qi][order] = logits[row]
        if stats is not None:
            stats.forward_ms += (time.perf_counter() - t1) * 1000
            stats.forwards += len(forwards)
            stats.packed_tokens += sum(f.batch.n_tokens for f in forwards)
            stats.prompt_tokens += sum(len(p) for t in tokenized for p in t.prompts)
        return out

    def decide(self, request: DecisionRequest, stats: Stats | None = None) -> SystemOneResponse | BasalResponse:
        """Answer a planned request (no pausing, no batching with other requests)."""
        stats = stats if stats is not None else Stats()
        started = time.perf_counter()
        rounds = self.plan(request)
        stats.tokenize_ms += (time.perf_counter() - started) * 1000
        while not rounds.done:  # one pass for an ordinary request; a large choice adds its final round
            self.advance(rounds, run_to_end(self.letter_logits(rounds.tokenized, stats)))
        return self.respond(rounds, (time.perf_counter() - started) * 1000)

    def answer(
        self,
        request: DecisionRequest,
        logits: dict[str, list[np.ndarray]],
        input_tokens: int,
        latency_ms: float,
        joints: dict[str, np.ndarray] | None = None,
    ) -> SystemOneResponse | BasalResponse:
        """Letter logits per question (joint distributions of large choices) -> the response in the dialect."""
        answers = {}
        for q in request.questions:
            if q.deferred_error is not None:  # upstream: raised while building this answer
                raise q.deferred_error
            if joints and q.name in joints:
                joint = joints[q.name]
                dists = [Distribution([], joint, calibrate(joint, self.model.calibration.temperature(q.item.type)))]
            else:
                dists = self.distributions(q, logits.get(q.name, []))
            if q.kind == "multi":
                answers[q.name] = answer_multi(q, dists)
            elif q.kind == "act":
                answers[q.name] = answer_act(q, dists[0], self.model.calibration, request.dialect)
            else:
                answers[q.name] = (answer_systemone if request.dialect == "systemone" else answer_basal)(q, dists[0])
        if request.dialect == "systemone":
            return SystemOneResponse(request.model, answers, Usage(input_tokens))
        if any(q.evidence for q in request.questions):  # upstream checks the evidence head after the answers
            raise evidence_refusal_basal()
        n, branches = len(request.questions), sum(q.branch_count for q in request.questions)
        return BasalResponse(request.model, answers, BasalUsage(input_tokens, 0, n, branches, round(latency_ms, 2)))

    def distributions(self, question: Question, rows: Sequence[np.ndarray]) -> list[Distribution]:
        """One distribution per readout of the question; `rows` = letter logits of its readouts' orders in turn."""
        if not question.needs_model:
            return [certain()]
        out, at = [], 0
        for item in question.asked:
            n, k = len(item.orders), len(item.options)
            temperature = self.model.calibration.temperature(item.type)
            out.append(distribution([lg[:k] for lg in rows[at : at + n]], item.orders, temperature))
            at += n
        return out
