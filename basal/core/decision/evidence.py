"""Evidence spans (basal-1.5 `evidence: true`): which characters of the state support a question's answer.

A small pointer head (`basal.core.model.evidence_head`) scores every state token of the question's
original-order prompt as the start and as the end of a span, from the final-layer hidden states (after the final
RMSNorm) of those tokens and of the readout token. Spans are the best non-overlapping (start, end) pairs, in
character offsets of the state text. Host math in float32, as upstream.

    rows  = state tokens t0..t1-1 of the order-1 prompt;  q = the readout token
    s_i   = (LN(h_i) Wsᵀ) · (LN(q) Usᵀ) / √k + LN(h_i) bsᵀ           e_i: the same with We, Ue, be
    score = log_softmax(s)_i + log_softmax(e)_j   for i <= j < i + 80
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_SPAN = 80  # tokens
CANDIDATES_PER_SPAN = 4  # candidates = the 4 * top best pairs
SEARCH_TOP = 5  # spans collected before the facts-block limit
ANSWER_TOP = 3  # spans returned
MASKED = np.float32(-1e9)


# ---------------------------------------------------------------------------------------------------------------
# Which tokens are the state's


@dataclass(frozen=True)
class StateTokens:
    """Tokens t0..t1-1 of the order-1 prompt cover the state; `rel` = their character offsets in the state."""

    t0: int
    t1: int
    rel: list[tuple[int, int]]


def state_tokens(prompt: str, state_text: str, offsets: Sequence[tuple[int, int]]) -> StateTokens | None:
    """Locate the state in the prompt (first ``"\\n" + state``) and the tokens inside it; None when there are none.

    `offsets` are the tokens' (start, end) code-point offsets in `prompt`. A token is inside iff start >= s0,
    end <= s1 and end > start; every token between the first and the last inside one takes part."""
    found = prompt.find("\n" + state_text)
    if found < 0:
        return None
    s0 = found + 1
    s1 = s0 + len(state_text)
    inside = [i for i, (a, b) in enumerate(offsets) if a >= s0 and b <= s1 and b > a]
    if not inside:
        return None
    t0, t1 = inside[0], inside[-1] + 1
    rel = [(max(a - s0, 0), max(b - s0, 0)) for a, b in offsets[t0:t1]]
    return StateTokens(t0, t1, rel)


# ---------------------------------------------------------------------------------------------------------------
# Spans


def best_spans(
    state_text: str,
    rel: Sequence[tuple[int, int]],
    ls: np.ndarray,
    le: np.ndarray,
    limit: int | None = None,
    top: int = SEARCH_TOP,
) -> list[dict[str, object]]:
    """The best non-overlapping spans, best first: {"text", "start", "end", "probability"}.

    Pair score ls_i + le_j (float32) for i <= j < i + 80, other pairs -1e9; candidates are the 4·top best pairs
    (ties: lower flat index i·n + j first); a candidate overlapping a kept span is skipped. `limit` (with
    facts: "auto", the length of the original state) drops spans starting at or after it and clips the rest. The
    first 3 are returned."""
    ls, le = np.asarray(ls, dtype=np.float32), np.asarray(le, dtype=np.float32)
    n = len(ls)
    if n == 0:
        return []
    count = min(CANDIDATES_PER_SPAN * top, n * n)
    kept: list[dict[str, object]] = []
    for index, score in _candidates(ls, le, count):
        a, b = rel[index // n][0], rel[index % n][1]
        if any(not (b <= k["start"] or a >= k["end"]) for k in kept):  # overlaps a kept span
            continue
        probability = float(np.exp(np.float64(score)))
        kept.append({"text": state_text[a:b], "start": a, "end": b, "probability": probability})
        if len(kept) == top:
            break
    if limit is not None:
        kept = [k for k in kept if k["start"] < limit]
        for k in kept:
            k["end"] = min(int(k["end"]), limit)  # type: ignore[call-overload]
            k["text"] = state_text[int(k["start"]) : int(k["end"])]  # type: ignore[call-overload]
    return kept[:ANSWER_TOP]


def _candidates(ls: np.ndarray, le: np.ndarray, count: int) -> list[tuple[int, np.float32]]:
    """The `count` best (flat index i·n + j, score) of the n×n pair matrix, best first, equal scores by flat index.

    Only the band i <= j < i + 80 can score above the mask, so when it holds `count` pairs scoring above it the
    candidates are among them: n·80 scores instead of n² (a long state has thousands of tokens). Otherwise (a
    state of a few tokens) the whole matrix, masked pairs included."""
    n = len(ls)
    i = np.arange(n)[:, None]
    j = i + np.arange(min(n, MAX_SPAN))[None, :]
    inside = j < n
    band = (ls[:, None] + le[np.minimum(j, n - 1)]).astype(np.float32)[inside]
    if band.size >= count and (band > MASKED).all():
        flat = (i * n + j)[inside]
    else:
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        band = np.where((j >= i) & (j - i < MAX_SPAN), (ls[:, None] + le[None, :]).astype(np.float32), MASKED)
        band, flat = band.ravel(), (i * n + j).ravel()
    if band.size > count:  # keep the count best and everything tied with the last of them
        threshold = np.partition(band, band.size - count)[band.size - count]
        keep = band >= threshold
        band, flat = band[keep], flat[keep]
    order = np.lexsort((flat, -band))[:count]  # descending score, then ascending flat index
    return [(int(flat[k]), band[k]) for k in order]
