"""Prefix-tree packing (docs/contract.md §3): prompts that share a prefix are computed once.

All option-order prompts of a forward — both orders of a question, every question of a request, questions of
different requests — go into a compressed prefix trie, flattened depth first into one token list without
padding. A block is the common prefix of its member prompts from its parent's end; a token sees the tokens of
its ancestor blocks and the earlier tokens of its own block, never a sibling's. Every token keeps its position in
its own prompt, so attention over a block's ancestor chain *is* the plain causal attention of that prompt.

    prompts  [t0 t1 t2 t3 t4]  [t0 t1 t2 t7 t8 t9]
    blocks   root=[t0 t1 t2] (pos 0..2) -> [t3 t4] (pos 3..4), [t7 t8 t9] (pos 3..5)
    flat     t0 t1 t2 t3 t4 t7 t8 t9, readouts at flat 4 and 7

Questions are split by prompt language (each row starts with the same template prefix, whose K/V a backend
may cache), questions about the same state sit next to each other, rows are cut at `tree_max_tokens` and
consecutive rows grouped into forwards of at most `forward_max_tokens`.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

MAX_DEPTH = 8
TREE_MAX_TOKENS = 32768
FORWARD_MAX_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class PackedForward:
    """What a backend runs: flat ragged tokens of one or more trie rows. All arrays int32, no padding."""

    tokens: np.ndarray  # [N] token ids
    positions: np.ndarray  # [N] index of the token in its own prompt
    block_of: np.ndarray  # [N] block of each token
    block_start: np.ndarray  # [B] flat index of a block's first token
    block_len: np.ndarray  # [B]
    block_parent: np.ndarray  # [B] parent block, -1 for a row's root
    block_prefix: (
        np.ndarray
    )  # [B] for a root: index into `prefix_keys` of the cached template prefix before it, else -1
    prefix_keys: tuple[str, ...]  # cached template prefixes used (language codes)
    readouts: np.ndarray  # [R] flat index of each readout token (the last token of a prompt)
    letter_ids: np.ndarray  # [L] letter token ids read at every readout
    # [H] flat index of further tokens whose final-normed hidden states are read (evidence: a question's state
    # tokens); distinct, none of them a readout. Empty for every forward without an evidence question.
    hidden: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    # state cache entries this forward fills: (entry key, the cached prefix it extends, flat index of each of its
    # further tokens in position order). A backend keeps the K/V of those rows, after the prefix's, as the prefix
    # `key` once every layer is done: the rows' K/V do not depend on what else the forward holds.
    fills: tuple[tuple[str, str, np.ndarray], ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def with_hidden_as_readouts(self) -> PackedForward:
        """The forward whose readouts are the readouts followed by the hidden rows: a backend runs its last layer at
        these rows (rows are computed independently, so the first R rows keep their bits) and reads the states of
        rows R.. as the hidden states."""
        return replace(self, readouts=np.concatenate([self.readouts, self.hidden]).astype(np.int32), hidden=_NONE)

    def chain(self, block: int) -> list[int]:
        """Blocks from the row's root down to `block`."""
        out = []
        while block >= 0:
            out.append(block)
            block = int(self.block_parent[block])
        return out[::-1]


_NONE = np.zeros(0, dtype=np.int32)


def single_prompt_forward(tokens: Sequence[int]) -> PackedForward:
    """One prompt at positions 0..n-1 in one block, read out at its last token (template-prefix K/V)."""
    n = len(tokens)

    def i32(x):
        return np.asarray(x, dtype=np.int32)

    return PackedForward(
        i32(tokens), i32(range(n)), i32([0] * n), i32([0]), i32([n]), i32([-1]), i32([-1]), (), i32([n - 1]), i32([])
    )


def continuation_forward(tokens: Sequence[int], start: int, base: str) -> PackedForward:
    """One prompt's tokens at positions start..start+n-1, in one block after the cached prefix `base` (which holds
    positions 0..start-1), read out at its last token: a state cache entry extending another."""
    n = len(tokens)

    def i32(x):
        return np.asarray(x, dtype=np.int32)

    return PackedForward(
        i32(tokens),
        i32(range(start, start + n)),
        i32([0] * n),
        i32([0]),
        i32([n]),
        i32([-1]),
        i32([0]),
        (base,),
        i32([n - 1]),
        i32([]),
    )


SHARE_MIN_TOKENS = 64  # a prompt shares another's ids only from this many common tokens (else it keeps its own)


@dataclass(frozen=True, slots=True, eq=False)
class SharedIds:
    """A prompt's token ids as the first `n` ids of a tuple that the prompts on one state share, then its own.

    Every prompt on a state repeats the template and the state; as a tuple of its own each would hold 8 bytes per
    state token, so a request's memory would grow with questions × state. Stored this way it grows with what the
    prompts do not share (about the packed tokens). It reads as the tuple it stands for (length, items, slices,
    order, equality, hash), and `n` is always the common prefix with `base`, so two of one base compare without
    building either."""

    base: tuple[int, ...]
    n: int
    tail: tuple[int, ...]

    def __len__(self) -> int:
        return self.n + len(self.tail)

    def ids(self) -> tuple[int, ...]:
        return self.base[: self.n] + self.tail

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.base[: self.n], self.tail)

    def __getitem__(self, k):
        n = self.n
        if isinstance(k, slice):
            start, stop, step = k.indices(len(self))
            if step != 1:
                return self.ids()[k]
            if stop <= n:
                return self.base[start:stop]
            if start >= n:
                return self.tail[start - n : stop - n]
            return self.base[start:n] + self.tail[: stop - n]
        i = k + len(self) if k < 0 else k
        if i < 0:
            raise IndexError("prompt index out of range")
        return self.base[i] if i < n else self.tail[i - n]

    def after(self, k: int, cut_bases: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> Ids:
        """The ids from position `k` on, still shared: the prompts of one base share one cut base
        (`cut_bases`: id of a base -> (base, its cut), kept by the caller for one set of prompts)."""
        if k > self.n:
            return self[k:]
        known = cut_bases.get(id(self.base))
        if known is None:
            known = cut_bases[id(self.base)] = (self.base, self.base[k:])  # the base too, so its id stays its own
        return SharedIds(known[1], self.n - k, self.tail)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedIds) and other.base is self.base:
            return self.n == other.n and self.tail == other.tail
        if isinstance(other, (tuple, SharedIds)):
            return self.ids() == as_tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ids())

    def __lt__(self, other: Ids) -> bool:
        return _order(self, other) < 0

    def __gt__(self, other: Ids) -> bool:
        return _order(self, other) > 0

    def __le__(self, other: Ids) -> bool:
        return _order(self, other) <= 0

    def __ge__(self, other: Ids) -> bool:
        return _order(self, other) >= 0


Ids = tuple[int, ...] | SharedIds


def as_tuple(p: Sequence[int]) -> tuple[int, ...]:
    return p if type(p) is tuple else p.ids() if isinstance(p, SharedIds) else tuple(p)


def _order(a: Ids, b: Ids) -> int:
    """-1, 0 or 1 as the tuples `a` and `b` stand for compare (without building them when they share a base)."""
    if isinstance(a, SharedIds) and isinstance(b, SharedIds) and a.base is b.base:
        if a.n == b.n:
            return (a.tail > b.tail) - (a.tail < b.tail)
        if a.n < b.n:  # a leaves the base at a.n (its next id differs from the base's) or ends there; b follows it
            return -1 if not a.tail or a.tail[0] < a.base[a.n] else 1
        return 1 if not b.tail or b.tail[0] < b.base[b.n] else -1
    x, y = as_tuple(a), as_tuple(b)
    return (x > y) - (x < y)


def common_prefix(a: Sequence[int], b: Sequence[int], guess: int = 0) -> int:
    """Length of the common prefix of two tuples by slice comparisons (C loops, not one Python step a token):
    `guess` first (the previous prompt's answer is usually this one's), then a binary search."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; the answer is at most hi
    if 0 < guess <= hi:
        if a[:guess] == b[:guess]:
            if guess == hi or a[guess] != b[guess]:
                return guess
            lo = guess + 1
        else:
            hi = guess - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptSharer:
    """Stores each tokenized prompt as `SharedIds` over the first prompt seen on its state (when they share at
    least `SHARE_MIN_TOKENS` tokens): the ids are unchanged, only where they are kept."""

    def __init__(self) -> None:
        self._bases: dict[str, tuple[tuple[int, ...], int]] = {}  # state text -> (first prompt's ids, last n)

    def __call__(self, state: str, ids: tuple[int, ...]) -> tuple[int, ...] | SharedIds:
        base, guess = self._bases.get(state, (None, 0))
        if base is None:
            self._bases[state] = (ids, 0)
            return ids
        n = common_prefix(base, ids, guess)
        self._bases[state] = (base, n)
        return SharedIds(base, n, ids[n:]) if n >= SHARE_MIN_TOKENS else ids


@dataclass(frozen=True, slots=True)
class TokenizedQuestion:
    """One question ready to pack: one token list per option order (`ids`: each a tuple, or `SharedIds` with the
    other prompts on its state; `prompts` gives them as tuples)."""

    lang: str
    state: str  # state text, to place questions on the same state next to each other
    ids: tuple[tuple[int, ...] | SharedIds, ...]
    # evidence: token indices of prompt 0 whose final hidden states are read (a range: a few integers, not one per
    # state token per question)
    hidden: Sequence[int] = ()
    letter_mass: bool = False  # diagnostics: the full-vocabulary log-sum-exp at each readout is computed too
    # the cached prefix its prompts start with: None, its language's template prefix; else a state cache entry's
    # key (the template and the state, `state_cache.py`), set just before packing
    prefix_key: str | None = None
    cached_tokens: int = 0  # tokens of each prompt read from the state cache (usage.cached_tokens)
    cache_scope: str = ""  # its request's `cache_scope`: it reads only state cache entries of that scope
    # a state cache entry its forward fills from the rows of its first prompt's tokens after its cached prefix:
    # (the entry's key, the entry's tokens, template and state), set just before packing
    fill: tuple[str, int] | None = None
    # evidence on a cached state: the final-normed hidden states f32 of its first state tokens, read from a state
    # cache entry (`hidden` then holds only the state tokens after the entry, which its forward computes)
    hidden_cached: np.ndarray | None = field(default=None, compare=False)
    # a state cache entry whose hidden states its forward keeps: (the entry's key, the entry's tokens); the rows of
    # its first prompt's tokens after its cached prefix, up to that many
    hidden_fill: tuple[str, int] | None = None

    @property
    def evidence(self) -> bool:
        """It reads the final hidden states of its state tokens (from its forward, a state cache entry, or both)."""
        return bool(self.hidden) or self.hidden_cached is not None

    @property
    def prompts(self) -> tuple[tuple[int, ...], ...]:
        """The token ids of each order as tuples (built anew for shared ones: hold them only while packing)."""
        return tuple(p if type(p) is tuple else p.ids() for p in self.ids)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Tokens of each order's prompt, without building its ids."""
        return tuple(map(len, self.ids))


@dataclass(frozen=True, slots=True)
class StateRows:
    """A question's final hidden states as rows of its forward's array, which the questions on one state share:
    each question holds a few references, not a copy of the state's hidden states. `np.asarray` gives the rows of
    its state tokens, then its order-0 readout's row, float32 [n + 1, d] (a new array each time)."""

    states: np.ndarray  # [R + H, d] the forward's final-normed hidden states: its R readouts, then `packed.hidden`
    first: int  # R: the row of `packed.hidden`'s first token in `states`
    rows: np.ndarray  # rows of `packed.hidden` for the question's state tokens, in token order (shared)
    query: int  # row of its order-0 readout in `states`
    cached: np.ndarray | None = None  # the rows of its first state tokens, from a state cache entry (before `rows`)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        parts = [self.states[self.first + self.rows], self.states[self.query : self.query + 1]]
        out = np.concatenate(parts if self.cached is None else [self.cached, *parts])
        return out if dtype is None else out.astype(dtype, copy=False)


class ItemLogits(list):
    """The letter logits of one question, one array per option order; `states` (evidence questions only): the
    final-normed hidden states of its `hidden` tokens, then of its order-0 readout token, float32 [n + 1, d] once
    read with `np.asarray`."""

    states: StateRows | None = None
    # diagnostics (`letter_mass` questions only): log of the softmax normaliser over the whole vocabulary at each
    # order's readout, float64 [orders]
    log_norms: np.ndarray | None = None
    cached_tokens: int = 0  # tokens of its prompts read from the state cache (usage.cached_tokens)


@dataclass(frozen=True, slots=True)
class Forward:
    """One backend call and where each (question, order) reads its letter logits."""

    packed: PackedForward
    readout_of: dict[tuple[int, int], int]  # (question index, order index) -> readout row
    hidden_of: dict[int, np.ndarray] = field(default_factory=dict)  # question index -> rows of `packed.hidden`
    prepared: object = None  # host work a backend did for this forward before the device is taken (`prepare`)
    letter_mass: tuple[int, ...] = ()  # question indices whose readouts' vocabulary log-sum-exp is computed
    states: tuple = ()  # state cache entries its rows start with (`state_cache.Entry`), filled before it runs
    cached_tokens: dict[int, int] = field(default_factory=dict)  # question index -> tokens per prompt from them
    # state cache entries whose hidden states it computes: (entry key, the cached prefix its rows follow, rows of
    # `packed.hidden` for the entry's tokens after that prefix, in position order)
    hidden_fills: tuple[tuple[str, str, np.ndarray], ...] = ()
    # the same as the pipeline keeps them: (`state_cache.Entry`, the prefix entry's hidden rows or None, rows)
    keeps: tuple = ()
    # question index -> the hidden states of its first state tokens, read from a state cache entry (evidence hits)
    cached_states: dict[int, np.ndarray] = field(default_factory=dict)


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Common prefix of two prompts' ids (two of one shared base without building either)."""
    if isinstance(a, SharedIds) and isinstance(b, SharedIds) and a.base is b.base:
        return min(a.n, b.n) if a.n != b.n else a.n + common_prefix(a.tail, b.tail)
    return common_prefix(as_tuple(a), as_tuple(b))


class TrieSize:
    """Packed-token count of a growing set of prompts (shared prefixes counted once), updated in O(log n + L).

    Sorted order makes the trie size Σ (len(p) − lcp(p, predecessor)); inserting p between a and b changes it by
    len(p) − lcp(a, p) − lcp(p, b) + lcp(a, b)."""

    def __init__(self) -> None:
        self._sorted: list[Ids] = []
        self.tokens = 0

    def added(self, prompt: Ids) -> int:
        """Tokens `prompt` would add (0 for a duplicate)."""
        i = bisect.bisect_left(self._sorted, prompt)
        a = self._sorted[i - 1] if i > 0 else ()
        b = self._sorted[i] if i < len(self._sorted) else ()
        return len(prompt) - lcp(a, prompt) - lcp(prompt, b) + lcp(a, b)

    def add(self, prompt: Ids) -> int:
        delta = self.added(prompt)
        bisect.insort(self._sorted, prompt)
        self.tokens += delta
        return delta

    def remove(self, prompt: Ids) -> None:
        """Undo one `add` of `prompt`."""
        i = bisect.bisect_left(self._sorted, prompt)
        if i == len(self._sorted) or self._sorted[i] != prompt:
            raise KeyError("prompt not in the set")
        del self._sorted[i]
        self.tokens -= self.added(prompt)


def packed_tokens(prompts: Sequence[Sequence[int]], cached_prefix: int = 0) -> int:
    """Tokens a set of prompts costs in one tree (the cached template prefix, if any, is not computed)."""
    size = TrieSize()
    for p in prompts:
        size.add(p if isinstance(p, SharedIds) else tuple(p))
    return size.tokens - (cached_prefix if prompts else 0)


# ---------------------------------------------------------------------------------------------------------------
# One trie row


@dataclass
class _RowBuilder:
    """Flattens the compressed trie of one row's (deduplicated) prompts, depth first."""

    offset: int  # tokens already cut from every prompt (the cached template prefix)
    max_depth: int
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    block_of: list[int] = field(default_factory=list)
    blocks: list[tuple[int, int, int]] = field(default_factory=list)  # (start, len, parent) local to the row
    ends: dict[int, int] = field(default_factory=dict)  # unique prompt -> local flat index of its last token

    def emit(self, prompt: tuple[int, ...], start: int, end: int, parent: int) -> int:
        block = len(self.blocks)
        self.blocks.append((len(self.tokens), end - start, parent))
        self.tokens.extend(prompt[start:end])
        self.positions.extend(range(start + self.offset, end + self.offset))
        self.block_of.extend([block] * (end - start))
        return block

    def add(self, prompts: list[tuple[int, ...]], members: list[int], start: int, parent: int, depth: int) -> None:
        if len(members) > 1 and depth + 1 >= self.max_depth:  # depth limit: no further sharing
            for m in members:
                self.add(prompts, [m], start, parent, depth)
            return
        first = prompts[members[0]]
        # members agree on their first `start` ids, so their common prefix from `start` is lcp - start
        end = len(first) if len(members) == 1 else min(lcp(first, prompts[m]) for m in members)
        block = parent
        if end > start:
            block = self.emit(first, start, end, parent)
            depth += 1
        groups: dict[int, list[int]] = {}
        for m in members:
            if len(prompts[m]) == end:
                self.ends[m] = len(self.tokens) - 1  # ends here: reads out at this block's last token
            else:
                groups.setdefault(prompts[m][end], []).append(m)
        for group in groups.values():
            self.add(prompts, group, end, block, depth)


def pack_row(prompts: Sequence[tuple[int, ...]], offset: int = 0, max_depth: int = MAX_DEPTH) -> _RowBuilder:
    """Trie of one row. `prompts` must be distinct; `offset` = tokens already removed from each (cached prefix)."""
    row = _RowBuilder(offset, max_depth)
    if prompts:  # a single prompt becomes one block (an empty root), as in the reference packer
        row.add(list(prompts), list(range(len(prompts))), 0, -1, 0)
    return row


def pack_fields(prompts: Sequence[Sequence[int]]) -> dict[str, object]:
    """The reference export's ``pack`` record of one question packed alone: prefix_len (common prefix of the
    orders, capped so that every order keeps a token), packed_len and readout_cols."""
    unique = list(dict.fromkeys(tuple(p) for p in prompts))
    row = pack_row(unique)
    capped = min(lcp(prompts[0], p) for p in prompts) if len(prompts) > 1 else 0
    capped = min(capped, min(len(p) for p in prompts) - 1) if len(prompts) > 1 else 0
    return {
        "prefix_len": capped,
        "packed_len": len(row.tokens),
        "readout_cols": [row.ends[unique.index(tuple(p))] for p in prompts],
    }


# ---------------------------------------------------------------------------------------------------------------
# Questions -> forwards


def split_forwards(
    questions: Sequence[TokenizedQuestion],
    letter_ids: Sequence[int],
    prefixes: dict[str, tuple[int, ...]] | None = None,
    tree_max_tokens: int = TREE_MAX_TOKENS,
    forward_max_tokens: int = FORWARD_MAX_TOKENS,
    max_depth: int = MAX_DEPTH,
    share_across_questions: bool = True,
) -> list[Forward]:
    """Pack questions into trie rows and rows into forwards.

    `prefixes` maps a key to the prefix tokens whose K/V the backend has cached: a language to its template
    prefix, a state cache entry's key to its template and state; a question's rows leave out the prefix of its
    `prefix_key` (else of its language), which every prompt of the question starts with. Identical prompts share
    a readout.
    `share_across_questions=False` puts every question in a row of its own (only its two option orders share a
    prefix, as upstream 1.0 packed): the baseline that shows what the tree saves.
    """
    prefixes = prefixes or {}

    def cached(q: TokenizedQuestion) -> str | None:  # a hidden row inside the cached prefix: that row computes it all
        key = q.prefix_key or q.lang
        return key if key in prefixes and (not q.hidden or q.hidden[0] >= len(prefixes[key])) else None

    rows: list[tuple[str, str | None, list[int]]] = []  # (lang, the cached prefix it starts with, question indices)
    for lang, use_prefix in dict.fromkeys((q.lang, cached(q)) for q in questions):
        state_rank: dict[str, int] = {}
        ordered = sorted(
            (i for i, q in enumerate(questions) if q.lang == lang and cached(q) == use_prefix),
            key=lambda i: state_rank.setdefault(questions[i].state, len(state_rank)),
        )
        size, current = TrieSize(), []
        for i in ordered:
            added = sum(size.added(p) for p in questions[i].ids)
            if current and (size.tokens + added > tree_max_tokens or not share_across_questions):
                rows.append((lang, use_prefix, current))
                size, current = TrieSize(), []
            for p in questions[i].ids:
                size.add(p)
            current.append(i)
        if current:
            rows.append((lang, use_prefix, current))

    forwards, group, group_tokens = [], [], 0
    for _lang, use_prefix, members in rows:
        built = _build_row(questions, members, prefixes[use_prefix] if use_prefix else (), max_depth)
        n = len(built[0].tokens)
        if group and group_tokens + n > forward_max_tokens:
            forwards.append(_assemble(group, letter_ids))
            group, group_tokens = [], 0
        group.append((use_prefix, *built))
        group_tokens += n
    if group:
        forwards.append(_assemble(group, letter_ids))
    return forwards


def _build_row(questions, members, prefix: tuple[int, ...], max_depth: int = MAX_DEPTH):
    unique: dict[Ids, int] = {}
    slots: list[tuple[int, int, int]] = []  # (question, order, unique prompt)
    cut_bases: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for i in members:
        for order, p in enumerate(questions[i].ids):
            if prefix and (p[: len(prefix)] != prefix or len(p) <= len(prefix)):
                what = f"state prefix {questions[i].prefix_key}" if questions[i].prefix_key else "template prefix"
                raise ValueError(f"a prompt does not start with its cached {questions[i].lang} {what}; this is a bug")
            slots.append((i, order, unique.setdefault(_cut(p, prefix, cut_bases), len(unique))))
    row = pack_row(list(unique), offset=len(prefix), max_depth=max_depth)
    wants = {
        i: (unique[_cut(questions[i].ids[0], prefix, cut_bases)], questions[i].hidden)
        for i in members
        if questions[i].evidence
    }

    def after_prefix(name: str) -> dict[str, tuple[int, range]]:  # entry key -> (its prompt, the rows to keep)
        return {
            spec[0]: (unique[_cut(questions[i].ids[0], prefix, cut_bases)], range(len(prefix), spec[1]))
            for i in members
            if (spec := getattr(questions[i], name)) is not None
        }

    return row, slots, wants, after_prefix("fill"), after_prefix("hidden_fill")


def _cut(prompt: Ids, prefix: tuple[int, ...], cut_bases: dict) -> Ids:
    """The prompt after the cached template prefix (still shared with its state's other prompts)."""
    if not prefix:
        return prompt
    return prompt.after(len(prefix), cut_bases) if isinstance(prompt, SharedIds) else prompt[len(prefix) :]


def _flat_positions(row: _RowBuilder, end: int, positions: Sequence[int]) -> list[int]:
    """Row-local flat indices of tokens at `positions` of the prompt whose last token is at `end`: each lies in
    one block of that prompt's chain (the blocks cover its positions after the cached prefix contiguously)."""
    chain = []
    block = row.block_of[end]
    while block >= 0:
        chain.append(row.blocks[block])
        block = row.blocks[block][2]
    out = []
    for p in positions:
        for start, length, _parent in chain:
            first = row.positions[start]
            if first <= p < first + length:
                out.append(start + p - first)
                break
        else:
            raise ValueError(f"prompt position {p} is not computed in this forward (inside the cached prefix)")
    return out


def _assemble(group, letter_ids) -> Forward:
    tokens, positions, block_of, starts, lens, parents, prefix_of, readouts = [], [], [], [], [], [], [], []
    keys: list[str] = []
    readout_of: dict[tuple[int, int], int] = {}
    hidden: dict[int, int] = {}  # flat index -> row of `hidden` (questions on one state share their rows)
    hidden_of: dict[int, np.ndarray] = {}
    rows_of: dict[tuple[int, ...], np.ndarray] = {}  # questions on one state share one array of its rows
    fills: list[tuple[str, str, np.ndarray]] = []
    hidden_fills: list[tuple[str, str, np.ndarray]] = []
    for key, row, slots, wants, fills_of, hidden_fills_of in group:  # key: the row's cached prefix (None: none)
        base_token, base_block = len(tokens), len(starts)
        tokens += row.tokens
        positions += row.positions
        block_of += [b + base_block for b in row.block_of]
        prefix_index = -1
        if key is not None:
            if key not in keys:
                keys.append(key)
            prefix_index = keys.index(key)
        for start, length, parent in row.blocks:
            starts.append(start + base_token)
            lens.append(length)
            parents.append(parent + base_block if parent >= 0 else -1)
            prefix_of.append(prefix_index if parent < 0 else -1)
        readout_row: dict[int, int] = {}
        for question, order, u in slots:
            if u not in readout_row:
                readout_row[u] = len(readouts)
                readouts.append(row.ends[u] + base_token)
            readout_of[(question, order)] = readout_row[u]
        for question, (u, wanted) in wants.items():
            flat = tuple(base_token + i for i in _flat_positions(row, row.ends[u], wanted))
            if flat not in rows_of:
                rows_of[flat] = np.asarray([hidden.setdefault(i, len(hidden)) for i in flat], dtype=np.int64)
            hidden_of[question] = rows_of[flat]
        for entry, (u, wanted) in fills_of.items():
            if key is None:
                raise ValueError("a state cache entry is filled only after a cached prefix; this is a bug")
            rows = np.asarray(_flat_positions(row, row.ends[u], wanted), dtype=np.int64) + base_token
            fills.append((entry, key, rows))
        for entry, (u, wanted) in hidden_fills_of.items():  # evidence: the entry's rows among the hidden rows
            if key is None:
                raise ValueError("a state cache entry's hidden states follow a cached prefix; this is a bug")
            flat = (base_token + i for i in _flat_positions(row, row.ends[u], wanted))
            hidden_fills.append((entry, key, np.asarray([hidden.setdefault(i, len(hidden)) for i in flat], np.int64)))

    def i32(x):
        return np.asarray(x, dtype=np.int32)

    packed = PackedForward(
        i32(tokens),
        i32(positions),
        i32(block_of),
        i32(starts),
        i32(lens),
        i32(parents),
        i32(prefix_of),
        tuple(keys),
        i32(readouts),
        i32(letter_ids),
        i32(list(hidden)),
        tuple(fills),
    )
    return Forward(packed, readout_of, hidden_of, hidden_fills=tuple(hidden_fills))
