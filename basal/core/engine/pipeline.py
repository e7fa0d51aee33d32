"""One model's work: what a request needs, and what to do with its results (the seam's four calls).

    admit   limits, the first round tokenized (`rounds.Rounds`), its cost with later rounds estimated
    pack    the requests' next rounds into one prefix tree, cut into forwards (host work)
    forward the pass over those forwards; each request's rows, by its `Rounds`
    settle  the rows into the request's rounds: its answer, or its next round and that round's cost

The engine (`basal.core.engine.engine`) calls them per pass with queues, lanes and the device gate around them
(`basal.core.engine.seam` holds the contract); `Pipeline.decide` calls them for one request, without queues
(`basal decide`, the tests and the in-process benchmarks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from basal.core.decision.answers import BasalResponse, SystemOneResponse
from basal.core.decision.diagnostics import Diagnostics, diagnose
from basal.core.decision.evidence import StateTokens, state_tokens
from basal.core.decision.large_choice import DEFAULT_STRATEGY, FINALISTS, Strategy, sub_item
from basal.core.decision.respond import EvidenceInputs, respond
from basal.core.engine.admission import check_chars, check_cost, check_length
from basal.core.engine.rounds import Rounds
from basal.core.engine.seam import Admitted, Answer, Facts, Next, Stats
from basal.core.errors import Cancelled
from basal.core.model.model_dir import ModelDir
from basal.core.model.prompt import LETTERS, Item, template_prefix
from basal.core.packing.backend import Backend
from basal.core.packing.passes import overlapped, run_to_end
from basal.core.packing.state_cache import StateCache
from basal.core.packing.tree import (
    FORWARD_MAX_TOKENS,
    TREE_MAX_TOKENS,
    Forward,
    ItemLogits,
    PromptSharer,
    StateRows,
    TokenizedQuestion,
    packed_tokens,
    split_forwards,
)
from basal.core.request.limits import Limits
from basal.core.request.plan import DecisionRequest, Question


@dataclass
class PackedPass:
    """One pass's host work: its prompts, their forwards, and whose prompts they are."""

    stats: Stats
    tokenized: list[TokenizedQuestion]  # the next round of every request, one request after another
    forwards: list[Forward]
    owners: list[tuple[Rounds, int]]  # each request, and how many entries of `tokenized` are its (in that order)


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
        state_cache_mb: float = 0,
    ):
        self.model = model
        self.large_choice = large_choice  # strategy for choices with 11..255 options
        self.backend = backend
        self.tokenizer = model.tokenizer
        self.letter_ids = self.tokenizer.letter_ids(len(LETTERS))
        self.tree_max_tokens = tree_max_tokens
        self.forward_max_tokens = forward_max_tokens
        self.share_across_questions = share_across_questions
        self.max_token_chars = self.tokenizer.max_token_chars  # a walk over the vocabulary: once
        self.prefixes: dict[str, tuple[int, ...]] = {}
        if prefix_cache:
            for lang, n in self.tokenizer.prefix_len.items():
                ids = tuple(self.tokenizer.encode(template_prefix(lang, model.bos))[:n])
                backend.prefix(lang, ids)
                self.prefixes[lang] = ids
        # STATE CACHE hook: states kept across requests (needs the template prefixes and a backend that can)
        self.state_cache: StateCache | None = None
        if state_cache_mb > 0 and self.prefixes and backend.caches_states:
            budget = int(state_cache_mb * (1 << 20))
            backend.reserve_states(budget)  # the GPU path's entries live in buffers sized now (prefix_slab.py)
            self.state_cache = StateCache(backend, budget, self.prefixes, self.tokenizer)

    def tokenize(self, questions: Sequence[Question]) -> list[TokenizedQuestion]:
        """Token ids of every option order of every readout the questions ask (a multi: one per label).

        The branches of a multi are separate entries about the same state, so the packer places them next to
        each other in one trie row (the state is computed once) and may cut rows between them."""
        return self.tokenize_items([item for q in questions for item in q.asked])

    @property
    def serves_evidence(self) -> bool:
        """The model has an evidence head and the backend reads hidden states (`run_with_hidden`)."""
        return self.model.evidence_head is not None and self.backend.reads_hidden_states

    def tokenize_items(
        self,
        items: Sequence[Item],
        evidence: dict[int, StateTokens | None] | None = None,
        letter_mass: bool = False,
        cache_scope: str = "",
    ) -> list[TokenizedQuestion]:
        """Token ids of every asked option order of each item.

        `evidence`: id(item) -> filled with where the state lies in the item's order-1 prompt; such an item asks
        for the final hidden states of those tokens too (docs: evidence). `letter_mass`: a diagnostics request;
        its readouts' full-vocabulary log-sum-exp is computed too where the backend reads hidden states."""
        letter_mass = letter_mass and self.backend.reads_hidden_states
        prompts = (item.prompt(perm, self.model.bos) for item in items for perm in item.orders)  # built as encoded
        ids = self.tokenizer.encode_stream(prompts)
        share = PromptSharer()  # the prompts on one state keep its ids once, not once each
        out = []
        shared: dict[tuple, StateTokens] = {}  # questions on one state share one StateTokens (its offsets list)
        for item in items:
            own = [next(ids) for _ in item.orders]
            tokenized = TokenizedQuestion(
                item.lang,
                item.state_text,
                tuple(share(item.state_text, p) for p in own),
                letter_mass=letter_mass,
                cache_scope=cache_scope,  # STATE CACHE hook: the entries it may read
            )
            if evidence is not None and id(item) in evidence:
                found = self._state_tokens(item, own[0])
                if found is not None:
                    found = shared.setdefault((found.t0, found.t1, tuple(found.rel)), found)
                    tokenized = replace(tokenized, hidden=range(found.t0, found.t1))
                evidence[id(item)] = found
            out.append(tokenized)
        return out

    def _state_tokens(self, item: Item, ids: tuple[int, ...]) -> StateTokens | None:
        prompt = item.prompt(item.orders[0], self.model.bos)
        with_offsets, offsets = self.tokenizer.encode_with_offsets(prompt)
        if tuple(with_offsets) != ids:
            raise RuntimeError("the tokenizer gave two tokenizations of one prompt; this is a bug")
        return state_tokens(prompt, item.state_text, offsets)

    def facts(self) -> Facts:
        """The model's facts for the engine, the front and the metrics (`compute` read afresh each time)."""
        return Facts(
            self.model.version,
            self.model.calibration,
            self.serves_evidence,
            self.backend.describe(),
            self.model.config.max_position_embeddings,
            self.max_token_chars,
            {lang: len(ids) for lang, ids in self.prefixes.items()},
            self.model.synthetic,
        )

    # -- the seam: admit, pack, forward, settle ----------------------------------------------------------------

    def admit(
        self, request: DecisionRequest, limits: Limits | None = None, cancelled: Callable[[], bool] = lambda: False
    ) -> Admitted:
        """Check the request's limits, tokenize its first round and cost every round (its state: `Rounds`).

        Characters are checked before anything is tokenized, so a request over a limit costs little. A large
        choice's final round is costed and length-checked before it is known, from stand-ins. `limits` None
        (`decide`): only the model's context is checked."""
        context = self.model.config.max_position_embeddings
        if limits is not None:
            check_chars(request, limits.max_prompt_chars or context * self.max_token_chars, limits, context)
        if cancelled():
            raise Cancelled()
        rounds = self._first_round(request)
        later = self._later_rounds_estimate(rounds)
        check_length(request, [*rounds.tokenized, *later], context, [*(i.name for i in rounds.asked), *rounds.large])
        cost = self.cost(rounds.tokenized) + (self.cost(later) if later else 0)
        if limits is not None:
            check_cost(request, cost, limits)
        return Admitted(rounds.tokenized, cost, rounds)

    def pack(self, states: Sequence[Rounds], stats: Stats | None = None) -> PackedPass:
        """The next round of every request in one prefix tree, cut into forwards: host work, done before the device
        is taken."""
        tokenized = [t for rounds in states for t in rounds.tokenized]
        stats = stats if stats is not None else Stats()
        owners = [(rounds, len(rounds.tokenized)) for rounds in states]
        return PackedPass(stats, tokenized, self.pack_questions(tokenized, stats), owners)

    def forward(self, packed: PackedPass, preemptible: bool = False) -> Generator[None, None, dict[Rounds, list]]:
        """Run a packed pass (every yield of the backend passed on: a checkpoint). -> each request's letter logits,
        one `ItemLogits` per entry of its round's `tokenized`, by its `Rounds`."""
        logits = yield from self.run_forwards(packed.tokenized, packed.forwards, packed.stats, preemptible)
        rows, at = {}, 0
        for rounds, n in packed.owners:  # `pack` laid each request's entries out together, in this order
            rows[rounds] = logits[at : at + n]
            at += n
        return rows

    def settle(
        self,
        state: Rounds,
        rows: Sequence[ItemLogits],
        arrival: float,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Answer | Next:
        """Hand a round's letter logits back (none when `admit` asked no round): the request's answer, or its next
        round, tokenized, length-checked and costed. `cancelled`: the client is gone (a large choice's fit stops
        between its steps with `Cancelled`)."""
        rounds = state
        if not rounds.done:
            if rounds.request.diagnostics:
                rounds.packed_tokens += self.cost(rounds.tokenized)
            rounds.take(rows, cancelled)
            if not rounds.done:
                rounds.tokenized = self.tokenize_items(
                    rounds.asked, letter_mass=_letter_mass(rounds.request), cache_scope=rounds.request.cache_scope
                )
                names = [i.name for i in rounds.asked]
                check_length(rounds.request, rounds.tokenized, self.model.config.max_position_embeddings, names)
                return Next(rounds.tokenized, self.cost(rounds.tokenized))
        elif rows:
            raise ValueError(f"{len(rows)} results for a request with no round to run")
        response = self._respond(rounds, (time.perf_counter() - arrival) * 1000)
        return Answer(response, self._diagnose(rounds) if rounds.request.diagnostics else None)

    def decide(self, request: DecisionRequest, stats: Stats | None = None) -> SystemOneResponse | BasalResponse:
        """Answer a request with the seam's calls: no queue, no pausing, no batching with other requests."""
        stats = stats if stats is not None else Stats()
        started = time.perf_counter()
        admitted = self.admit(request)
        stats.tokenize_ms += (time.perf_counter() - started) * 1000
        rounds, step = admitted.state, admitted
        while True:  # one pass for an ordinary request; a large choice adds its final round
            rows = run_to_end(self.forward(self.pack([rounds], stats)))[rounds] if step.tokenized else []
            settled = self.settle(rounds, rows, started)
            if isinstance(settled, Answer):
                return settled.response
            step = settled

    # -- rounds: a request whose later prompts depend on earlier answers (choices with 11..255 options) ------

    def _first_round(self, request: DecisionRequest) -> Rounds:
        """The request's rounds, the first one tokenized."""
        rounds = Rounds(request, self.large_choice)
        if rounds.evidence and not self.serves_evidence:  # the dialect refused it already, unless upstream's order
            rounds.evidence = frozenset()
        wanted = {id(q.asked[0]): q.name for q in request.questions if q.name in rounds.evidence}
        found: dict[int, StateTokens | None] = dict.fromkeys(wanted)
        rounds.tokenized = self.tokenize_items(rounds.asked, found, _letter_mass(request), request.cache_scope)
        rounds.state_tokens = {wanted[i]: st for i, st in found.items()}
        return rounds

    def _later_rounds_estimate(self, rounds: Rounds) -> list[TokenizedQuestion]:
        """Stand-ins for the final rounds before they are known: each large choice's 10 longest options (by
        characters), in both orders. Their cost and length bound the real final group's closely."""
        stand_ins = []
        for lc in rounds.large.values():
            options = lc.item.options
            longest = sorted(sorted(range(len(options)), key=lambda i: (-len(options[i]), i))[:FINALISTS])
            stand_ins.append(sub_item(lc.item, longest, f"{lc.item.name}#final", 2))
        return self.tokenize_items(stand_ins, cache_scope=rounds.request.cache_scope)

    def _respond(self, rounds: Rounds, latency_ms: float) -> SystemOneResponse | BasalResponse:
        """The response of a request whose rounds have all been run."""
        head = self.model.evidence_head if self.serves_evidence else None
        evidence = EvidenceInputs(head, rounds.state_tokens, rounds.states)
        response = respond(
            rounds.request,
            rounds.plain_logits,
            rounds.input_tokens,
            latency_ms,
            self.model.calibration,
            rounds.joints(),
            evidence,
        )
        if self.state_cache is not None and isinstance(response, BasalResponse):  # STATE CACHE hook
            response.usage.cached_tokens = rounds.cached_tokens
        return response

    def _diagnose(self, rounds: Rounds) -> Diagnostics:
        """What a client that asks for diagnostics gets with the answer of a request whose rounds have all run."""
        return diagnose(
            rounds.request,
            rounds.plain_logits,
            self.model.calibration,
            rounds.joints(),
            rounds.log_norms,
            rounds.input_tokens,
            rounds.packed_tokens,
        )

    # -- below the seam: prompts, packing and forwards of plain question lists ------------------------------

    def cost(self, tokenized: Sequence[TokenizedQuestion]) -> int:
        """Packed tokens of a set of questions, shared prefixes counted once (the scheduler's budget unit)."""
        total = 0
        for lang in {t.lang for t in tokenized}:
            prompts = [p for t in tokenized if t.lang == lang for p in t.ids]
            total += packed_tokens(prompts, len(self.prefixes.get(lang, ())))
        if self.state_cache is not None:  # STATE CACHE hook: cached states are not computed
            total -= self.state_cache.cached_tokens(tokenized)
        return total

    def cached_prefix(self, question: TokenizedQuestion) -> tuple[str, int] | None:
        """The computed state cache entry a question reads if packed now (its key and its tokens), else None."""
        hit = self.state_cache.computed(question) if self.state_cache is not None else None  # STATE CACHE hook
        return None if hit is None else (hit[0].key, hit[1])

    def letter_logits(
        self, tokenized: Sequence[TokenizedQuestion], stats: Stats | None = None
    ) -> Generator[None, None, list[list[np.ndarray]]]:
        """Letter logits of every order of every question (float32, first k letters), in `tokenized` order; yields
        between layers. The export's and the invariance tests' path for questions that are not requests."""
        forwards = self.pack_questions(tokenized, stats)
        return (yield from self.run_forwards(tokenized, forwards, stats))

    def pack_questions(self, tokenized: Sequence[TokenizedQuestion], stats: Stats | None = None) -> list[Forward]:
        """Trie rows and forwards of a list of questions: host work, done before the device is taken."""
        t0 = time.perf_counter()
        prefixes, entries = self.prefixes, {}
        if self.state_cache is not None:  # STATE CACHE hook: questions on a cached (or to-be-cached) state read it
            tokenized, states, entries = self.state_cache.assign(tokenized)
            prefixes = {**prefixes, **states}
        forwards = split_forwards(
            tokenized,
            self.letter_ids,
            prefixes,
            self.tree_max_tokens,
            self.forward_max_tokens,
            share_across_questions=self.share_across_questions,
        )
        if entries:
            forwards = [self._with_states(f, entries, tokenized) for f in forwards]
        forwards = [self._with_letter_mass(f, tokenized) for f in forwards]
        forwards = [
            f if f.hidden_of or f.letter_mass else replace(f, prepared=self.backend.prepare(f.packed)) for f in forwards
        ]
        if stats is not None:
            stats.pack_ms += (time.perf_counter() - t0) * 1000
        return forwards

    @staticmethod
    def _with_states(f: Forward, entries: dict, tokenized: Sequence[TokenizedQuestion]) -> Forward:
        """The forward with the state cache entries it reads or fills, its questions' tokens served from them, and
        the entries whose hidden states it keeps (after a state entry's: those taken now, while it holds them)."""
        keys = (*f.packed.prefix_keys, *(key for key, _, _ in f.packed.fills))
        states = tuple(entries[k] for k in keys if k in entries)
        cached = {qi: tokenized[qi].cached_tokens for qi, _ in f.readout_of if tokenized[qi].cached_tokens}
        keeps = []
        for key, prefix, rows in f.hidden_fills:
            before = entries[prefix].hidden if prefix in entries else None
            if prefix not in entries or before is not None:  # after the template, or after an entry's hidden states
                keeps.append((entries[key], before, rows))
        read = {qi: tokenized[qi].hidden_cached for qi in f.hidden_of if tokenized[qi].hidden_cached is not None}
        return replace(f, states=states, cached_tokens=cached, keeps=tuple(keeps), cached_states=read)

    @staticmethod
    def _with_letter_mass(f: Forward, tokenized: Sequence[TokenizedQuestion]) -> Forward:
        """The forward, marked with its questions that ask for the vocabulary log-sum-exp (diagnostics)."""
        wanted = tuple(sorted({qi for qi, _ in f.readout_of if tokenized[qi].letter_mass}))
        return replace(f, letter_mass=wanted) if wanted else f

    def run_forwards(
        self,
        tokenized: Sequence[TokenizedQuestion],
        forwards: Sequence[Forward],
        stats: Stats | None = None,
        preemptible: bool = False,
    ) -> Generator[None, None, list[ItemLogits]]:
        """Run packed forwards; every yield of the backend is passed on (a point where the pass may pause). On an
        asynchronous device the next forward is queued before the last one's result is waited for (passes.py).
        `preemptible`: the long lane's pass, which must pause between layers (the GPU path then runs no graph)."""
        t1 = time.perf_counter()
        out = [ItemLogits([None] * len(t.ids)) for t in tokenized]

        def collect(i: int, result) -> None:
            f = forwards[i]
            logits, states = result if f.hidden_of or f.letter_mass else (result, None)
            for (qi, order), row in f.readout_of.items():
                out[qi][order] = logits[row]
                out[qi].cached_tokens += f.cached_tokens.get(qi, 0)  # STATE CACHE hook: usage.cached_tokens
            first = len(f.packed.readouts)
            for qi, rows in f.hidden_of.items():  # state rows, then the order-1 readout row (the head's query)
                at = f.readout_of[(qi, 0)]
                out[qi].states = StateRows(states, first, rows, at, f.cached_states.get(qi))
            if f.keeps and self.state_cache is not None:  # STATE CACHE hook: entries' hidden states, kept with them
                for entry, before, rows in f.keeps:
                    self.state_cache.keep_hidden(entry, before, states[first + rows])
            if f.letter_mass:  # diagnostics: one vocabulary log-sum-exp per readout of the questions that ask
                rows = [f.readout_of[(qi, o)] for qi in f.letter_mass for o in range(len(tokenized[qi].ids))]
                norms = iter(self.backend.vocab_logsumexp(states[rows]))
                for qi in f.letter_mass:
                    out[qi].log_norms = np.array([next(norms) for _ in tokenized[qi].ids], dtype=np.float64)

        filled = [0]  # tokens computed to fill state cache entries alone (a forward's own fills are its tokens)
        yield from overlapped((self._run(f, preemptible, filled.append) for f in forwards), collect)
        if stats is not None:
            stats.forward_ms += (time.perf_counter() - t1) * 1000
            stats.forwards += len(forwards)
            stats.packed_tokens += sum(f.packed.n_tokens for f in forwards) + sum(filled)
            stats.prompt_tokens += sum(n for t in tokenized for n in t.lengths)
        return out

    def _run(self, f: Forward, preemptible: bool, computed: Callable[[int], None] = lambda n: None):
        """The backend's pass over one forward (a generator: nothing runs until it is driven)."""
        if f.hidden_of or f.letter_mass:  # evidence, diagnostics: final hidden states too (same readout bits)
            steps = self.backend.run_with_hidden(f.packed)
        else:
            steps = self.backend.run(f.packed, prepared=f.prepared, preemptible=preemptible)
        if f.states and self.state_cache is not None:  # STATE CACHE hook: its entries pinned in it, filled by it
            return self.state_cache.around(f.states, steps, computed, {key for key, _, _ in f.packed.fills})
        return steps


def _letter_mass(request: DecisionRequest) -> bool:
    """Whether the request's readouts get the full-vocabulary log-sum-exp: diagnostics that ask for the letter mass."""
    return request.diagnostics and request.letter_mass
