"""The cross-request state cache: the K/V of a state, kept after a request, reused by later ones (docs/caches.md).

A prompt is the template prefix (cached at load), the state, then the question and its options. An entry holds the
K/V of a prompt's template and state tokens for one language, under their exact token ids: a later question whose
prompts start with the same ids reads them as a cached prefix, as every prompt reads the template prefix
(`tree.split_forwards`). The tokens after it keep their positions and read the cached keys in the same
position-ordered tiles, so a hit gives the bits a miss gives (`tests/determinism/test_state_cache.py`).

A new entry is filled by the first forward that computes its state anyway: its questions are packed after the
template prefix, or after a cached entry the state extends (a partial hit: an append-only conversation's next
state), as without the cache, and the backend keeps the K/V of the state's rows of that forward
(`PackedForward.fills`) once its last layer is done. A row's K/V do not depend on what else the forward holds, so
they are the bits a forward of the state alone gives, and a miss costs no computation of its own. A forward packed
while another pass still has an entry to fill reads the entry, and computes it first (alone, `Backend.prefix`) if
it runs before that pass. Its bytes are what the backend holds (`Backend.prefix_bytes`).

Entries are evicted least recently used first once the kept bytes pass the budget; an entry a running forward
reads or fills is pinned until that forward ends, so the kept bytes stay within the budget plus the states of the
passes running at that moment. A pass stopped before an entry is complete leaves no entry: the backend sets it
only once every layer is done.

Evidence questions read the final-normed hidden states of their state tokens too, which only an evidence forward
computes (`run_with_hidden`): an entry keeps them (host f32, in its bytes) once such a forward on its state has
run, whether it filled the entry or computed its state again beside an entry filled without them. An evidence
question on an entry with hidden states reads both, and its forward computes only its question (and the state's
last tokens past the entry, if any); on one without, it computes its state as without the cache. A row's final
hidden state, like its K/V, depends only on the tokens before it, so either way it gets the same bits.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from basal.core.model.prompt import template_prefix
from basal.core.model.tokenizer import Tokenizer
from basal.core.packing.tree import TokenizedQuestion, common_prefix

PARTIAL_WINDOW = 64  # a partial hit is looked for among this many most recently used entries of the language
CUT_MEMO = 4096  # states whose cut is remembered between admission and packing (a digest and a length each)


@dataclass(eq=False)
class Entry:
    """One cached state: its backend key and its token ids (the template's and the state's, positions 0..n-1)."""

    key: str
    lang: str
    ids: tuple[int, ...]
    scope: str = ""  # the requests that may read it (`DecisionRequest.cache_scope`)
    base: Entry | None = None  # a cached entry whose ids it extends (a partial hit), used when it is computed
    nbytes: int = 0  # what the backend holds for it (0 until computed, and after eviction)
    pins: int = 0  # forwards running with it
    ready: bool = False  # computed and held by the backend
    filler: object = None  # the packing whose forward fills it (None: no forward is due to)
    # final-normed hidden states f32 [state tokens, d] of its tokens after the template (an evidence forward's),
    # counted in `nbytes`; None until an evidence forward on its state has run
    hidden: np.ndarray | None = None


@dataclass
class StateCounts:
    hits: int = 0  # states found computed when a forward was packed
    partial_hits: int = 0  # states that extend a computed one: only the new tokens are computed
    misses: int = 0  # states computed from the template prefix
    evictions: int = 0
    computed_tokens: int = 0  # tokens computed to fill entries


class StateCache:
    """Entries of one backend (one model, one dtype). Thread-safe: lanes pack in their threads; entries are
    computed and evicted under the gate."""

    def __init__(self, backend: Any, budget_bytes: int, templates: dict[str, tuple[int, ...]], tokenizer: Tokenizer):
        if budget_bytes < 1:
            raise ValueError("a state cache needs a positive budget")
        self.backend, self.budget, self.templates, self.tokenizer = backend, budget_bytes, templates, tokenizer
        self._entries: OrderedDict[tuple[str, str, tuple[int, ...]], Entry] = OrderedDict()  # least recently used first
        self._cuts: OrderedDict[bytes, int] = OrderedDict()  # digest of (language, state) -> tokens of its entry
        self._names = itertools.count()
        self._lock = threading.RLock()
        self.bytes = 0  # bytes of every computed entry
        self.counts = StateCounts()

    @property
    def entries(self) -> int:
        with self._lock:  # read by /metrics from another thread
            return sum(1 for e in self._entries.values() if e.ready)

    @property
    def tokens(self) -> int:
        """Tokens whose K/V the computed entries hold (each entry holds its template too)."""
        with self._lock:
            return sum(len(e.ids) for e in self._entries.values() if e.ready)

    # -- which tokens are a question's state -------------------------------------------------------------------

    def state_ids(self, t: TokenizedQuestion) -> tuple[int, ...] | None:
        """The ids an entry for this question would hold: its prompts' tokens that the template and its state
        give alone (a state's last token may merge with the text after it; then it is left out), when they go past
        the template prefix (else None: nothing to cache). Without the text between the state and the question,
        an entry's ids are a prefix of a longer state's that extends it (a partial hit). An evidence question whose
        state tokens start inside the template (a state found in the system prompt) computes its state."""
        template = self.templates.get(t.lang)
        if template is None or not t.ids or (t.hidden and t.hidden[0] < len(template)):
            return None
        first = t.ids[0]
        digest = hashlib.blake2b(f"{t.lang}\0{t.state}".encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with self._lock:
            n = self._cuts.get(digest)
            if n is not None:
                self._cuts.move_to_end(digest)
        if n is None:  # the template and the state tokenized alone: the prompt repeats them but perhaps the last
            cut = self.tokenizer.encode(template_prefix(t.lang, self.tokenizer.bos) + t.state)
            n = common_prefix(first, tuple(cut))
            with self._lock:
                self._cuts[digest] = n
                if len(self._cuts) > CUT_MEMO:
                    self._cuts.popitem(last=False)
        # the length only decides which ids are looked up; the ids themselves are the key, so a stale length can
        # cost a hit, never a wrong entry
        if n <= len(template) or any(len(p) <= n or p[:n] != first[:n] for p in t.ids):
            return None
        return tuple(first[:n])

    def cached_tokens(self, tokenized: Sequence[TokenizedQuestion]) -> int:
        """State tokens of these questions that computed entries hold (each distinct state once): what their cost
        leaves out; not a state that one of them computes anyway (evidence on an entry without hidden states)."""
        found, computes = set(), set()
        for t in tokenized:
            hit = self.computed(t)
            if hit is not None:
                found.add(hit)
            elif t.hidden and (ids := self.state_ids(t)) is not None:
                computes.add((t.cache_scope, t.lang, ids))
        return sum(n - len(self.templates[e.lang]) for e, n in found if (e.scope, e.lang, e.ids) not in computes)

    def computed(self, t: TokenizedQuestion) -> tuple[Entry, int] | None:
        """The computed entry a question reads if it is packed now, and its tokens (the template's included); an
        evidence question reads only one with hidden states."""
        ids = self.state_ids(t)
        if ids is None:
            return None
        with self._lock:
            entry = self._entries.get((t.cache_scope, t.lang, ids))
            if entry is None or not entry.ready or (t.hidden and entry.hidden is None):
                return None
            return entry, len(ids)

    # -- packing ------------------------------------------------------------------------------------------------

    def assign(
        self, tokenized: Sequence[TokenizedQuestion]
    ) -> tuple[list[TokenizedQuestion], dict[str, tuple[int, ...]], dict[str, Entry]]:
        """The questions with the cached prefix they read as `prefix_key` (their state's entry when it is computed,
        or another packing fills it; else the entry it extends, or none: the template prefix), the first question
        of a new entry's state with `fill` (its forward fills the entry), the entries' prefixes for the packer,
        and the entries by key (those read and those filled)."""
        out: list[TokenizedQuestion] = []
        used: dict[str, Entry] = {}
        packing = object()  # this packing: the entries it claims, its forwards fill
        for t in tokenized:
            ids = self.state_ids(t)
            if ids is None:
                out.append(t)
                continue
            first = all(e.ids != ids or e.lang != t.lang or e.scope != t.cache_scope for e in used.values())
            if t.hidden:
                out.append(self._assign_evidence(t, ids, first, packing, used))
                continue
            entry, cached = self._claim(t.cache_scope, t.lang, ids, first, packing)
            used[entry.key] = entry
            if entry.ready or entry.filler is not packing:  # computed, or another packing's forward fills it
                out.append(replace(t, prefix_key=entry.key, cached_tokens=cached))
                continue
            base = entry.base
            if base is not None:
                used[base.key] = base
            fill = (entry.key, len(ids)) if first else None  # its state's other questions share its rows
            out.append(replace(t, prefix_key=None if base is None else base.key, cached_tokens=cached, fill=fill))
        return out, {k: e.ids for k, e in used.items()}, used

    def _assign_evidence(
        self, t: TokenizedQuestion, ids: tuple[int, ...], first: bool, packing: object, used: dict[str, Entry]
    ) -> TokenizedQuestion:
        """An evidence question as it is packed: on an entry with hidden states, after it, its state tokens' hidden
        states read from it (`hidden_cached`; the forward computes those past the entry, if any); else after the
        template, or after the entry its new state extends where that one has hidden states, its forward keeping
        the entry's hidden states (`hidden_fill`) and filling its K/V if this packing claimed it."""
        template = len(self.templates[t.lang])
        t0, t1 = t.hidden[0], t.hidden[-1] + 1
        entry, how, base, hidden = self._claim_evidence(t.cache_scope, t.lang, ids, first, packing)
        used[entry.key] = entry
        start = len(base.ids) if base is not None else template
        if base is not None:
            used[base.key] = base
        cached = None if hidden is None else hidden[t0 - template : max(min(t1, start), t0) - template]
        t = replace(
            t,
            prefix_key=None if base is None else base.key,
            cached_tokens=start - template,
            hidden=range(max(t0, start), t1),
            hidden_cached=cached,
        )
        if how == "hit":
            return t
        return replace(
            t, fill=(entry.key, len(ids)) if how == "fill" and first else None, hidden_fill=(entry.key, len(ids))
        )

    def _claim_evidence(
        self, scope: str, lang: str, ids: tuple[int, ...], first: bool, packing: object
    ) -> tuple[Entry, str, Entry | None, np.ndarray | None]:
        """The entry of an evidence question's state, how the question uses it, and the entry it reads K/V and
        hidden states from with those hidden states (taken under the lock: an eviction drops them). How: "hit"
        (computed with hidden states: it reads both), "fill" (claimed by this packing: its forward fills it, after
        the entry it extends where that one has hidden states) or "compute" (computed without hidden states, or
        another packing fills it: it computes its state, and its forward's hidden states are kept if the entry is
        computed by then)."""
        with self._lock:
            entry = self._touch(scope, lang, ids)
            if entry.ready and entry.hidden is not None:
                self.counts.hits += first
                return entry, "hit", entry, entry.hidden
            if entry.ready or (entry.filler is not None and entry.filler is not packing):
                self.counts.misses += first
                return entry, "compute", None, None
            if entry.filler is None:
                entry.filler = packing
                entry.base = self._longest_base(scope, lang, ids)
            base = entry.base
            if base is None or base.hidden is None:  # computed from the template prefix
                self.counts.misses += first
                return entry, "fill", None, None
            self.counts.partial_hits += first
            return entry, "fill", base, base.hidden

    def _claim(self, scope: str, lang: str, ids: tuple[int, ...], first: bool, packing: object) -> tuple[Entry, int]:
        """The entry of a state (a new one claimed by `packing`, whose forward fills it, unless another packing
        has claimed it) and the tokens of each prompt it serves from the cache now. `first`: its first question
        in this packing (the counts count states)."""
        template = len(self.templates[lang])
        with self._lock:
            entry = self._touch(scope, lang, ids)
            if entry.ready:
                self.counts.hits += first
                return entry, len(ids) - template
            if entry.filler is None:
                entry.filler = packing
                entry.base = self._longest_base(scope, lang, ids)
            if entry.base is not None:
                self.counts.partial_hits += first
                return entry, len(entry.base.ids) - template
            self.counts.misses += first
            return entry, 0

    def _touch(self, scope: str, lang: str, ids: tuple[int, ...]) -> Entry:
        """The entry of a state, now the most recently used; a new one (not computed, nobody fills it) where there
        is none. The caller holds the lock."""
        entry = self._entries.get((scope, lang, ids))
        if entry is None:
            entry = self._entries[(scope, lang, ids)] = Entry(f"state-{next(self._names)}", lang, ids, scope)
        else:
            self._entries.move_to_end((scope, lang, ids))
        return entry

    def _longest_base(self, scope: str, lang: str, ids: tuple[int, ...]) -> Entry | None:
        best = None
        for entry in itertools.islice(reversed(self._entries.values()), PARTIAL_WINDOW):
            n = len(entry.ids)
            longer = best is None or n > len(best.ids)
            fits = entry.ready and entry.lang == lang and entry.scope == scope and n < len(ids) and longer
            if fits and ids[:n] == entry.ids:
                best = entry
        return best

    # -- running --------------------------------------------------------------------------------------------------

    def around(
        self,
        entries: Sequence[Entry],
        steps: Generator,
        computed: Callable[[int], None] = lambda n: None,
        fills: Sequence[str] = (),
    ) -> Generator:
        """A forward's pass with its entries: pinned for the whole pass; those it reads but no forward has filled
        yet computed first (one at a time, a pause point after each); those it fills (keys `fills`) taken as ready
        once it is done; unpinned, unclaimed and the budget restored at its end, however it ends. `computed(n)`:
        n tokens were computed, besides the forward's own, to fill an entry."""
        with self._lock:
            for e in entries:
                e.pins += 1
        try:
            for e in entries:
                if not e.ready and e.key not in fills:
                    computed(self._fill(e))
                    yield
            result = yield from steps
            for e in entries:
                if e.key in fills:
                    self._filled(e)
            return result
        finally:
            with self._lock:
                for e in entries:
                    e.pins -= 1
                    if e.key in fills:
                        e.filler = None
                self._evict()

    def keep_hidden(self, e: Entry, before: np.ndarray | None, rows: np.ndarray) -> None:
        """An evidence forward's final-normed hidden states of an entry's tokens after its cached prefix (`before`:
        that prefix's own, when it is a state cache entry): kept with the entry if it is computed and has none
        (else nothing: an entry evicted or not yet filled gets them from a later evidence forward on its state)."""
        hidden = rows if before is None else np.concatenate([before, rows])
        with self._lock:
            if not e.ready or e.hidden is not None or len(hidden) != len(e.ids) - len(self.templates[e.lang]):
                return
            e.hidden = hidden
            e.nbytes += hidden.nbytes
            self.bytes += hidden.nbytes
            self._evict()

    def _fill(self, e: Entry) -> int:
        """Compute an entry (under the gate) -> tokens computed."""
        base = e.base
        with self._lock:
            if base is not None and not base.ready:
                base = None
            if base is not None:
                base.pins += 1
        try:
            start = len(base.ids) if base is not None else len(self.templates[e.lang])
            nbytes = self.backend.prefix(e.key, e.ids[start:], base.key if base is not None else e.lang)
        finally:
            if base is not None:
                with self._lock:
                    base.pins -= 1
        self._ready(e, nbytes, len(e.ids) - start)
        return len(e.ids) - start

    def _filled(self, e: Entry) -> None:
        """An entry its forward filled (the backend holds it now), unless a forward that ran first computed it."""
        if e.ready:
            return
        start = len(e.base.ids) if e.base is not None else len(self.templates[e.lang])
        self._ready(e, self.backend.prefix_bytes(e.key), len(e.ids) - start)

    def _ready(self, e: Entry, nbytes: int, computed: int) -> None:
        with self._lock:
            e.nbytes, e.ready, e.base = nbytes, True, None
            self.bytes += nbytes
            self.counts.computed_tokens += computed
            where = (e.scope, e.lang, e.ids)
            slot = self._entries.get(where)
            if slot is None or not slot.ready:  # evicted while it waited, or another placeholder took its place
                self._entries[where] = e
            self._entries.move_to_end(where)

    def _evict(self) -> None:
        """Least recently used computed entries out, unpinned ones only, until the bytes fit the budget."""
        if self.bytes <= self.budget:
            return
        for ids_key, e in list(self._entries.items()):
            if self.bytes <= self.budget:
                break
            if e.ready and e.pins == 0:
                self._drop(ids_key, e)
                self.counts.evictions += 1

    def _drop(self, ids_key: tuple[str, str, tuple[int, ...]], e: Entry) -> None:
        self.backend.drop_prefix(e.key)
        self.bytes -= e.nbytes
        e.nbytes, e.ready, e.hidden = 0, False, None
        if self._entries.get(ids_key) is e:
            del self._entries[ids_key]

    def clear(self) -> None:
        """Forget every entry not in use (the model is reloaded, or a test wants a cold cache)."""
        with self._lock:
            for ids_key, e in list(self._entries.items()):
                if e.pins == 0:
                    if e.ready:
                        self._drop(ids_key, e)
                    else:
                        del self._entries[ids_key]

    def stats(self) -> dict[str, float]:
        """The counters and sizes `/metrics` and `basal doctor` show."""
        c = self.counts
        return {
            "hits_total": c.hits,
            "partial_hits_total": c.partial_hits,
            "misses_total": c.misses,
            "evictions_total": c.evictions,
            "computed_tokens_total": c.computed_tokens,
            "entries": self.entries,
            "bytes": self.bytes,
            "budget_bytes": self.budget,
        }
