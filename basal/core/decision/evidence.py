"""Evidence spans (basal-1.5 `evidence: true`): which characters of the state support a question's answer.

A small pointer head (`evidence_head.pt` in the model directory) scores every state token of the question's
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
from pathlib import Path

import msgspec
import numpy as np

from basal.core.model.torch_file import TorchFileError, load_tensors, save_tensors

HEAD_FILE = "evidence_head.pt"
HEAD_RANK = 256  # k of the shipped heads (the head class's default)
MAX_SPAN = 80  # tokens
CANDIDATES_PER_SPAN = 4  # candidates = the 4 * top best pairs
SEARCH_TOP = 5  # spans collected before the facts-block limit
ANSWER_TOP = 3  # spans returned
LN_EPS = 1e-5
MASKED = np.float32(-1e9)
_NAMES = ("ws", "us", "we", "ue", "bs", "be")


class EvidenceSpan(msgspec.Struct):
    """One span of the answer's `evidence` list: code-point offsets into the request's state text."""

    text: str
    start: int
    end: int
    probability: float


Evidence = list[EvidenceSpan] | msgspec.UnsetType  # the answer field; unset (absent) unless the question asked


@dataclass(frozen=True)
class EvidenceHead:
    """The pointer head's six float32 matrices: W*, U* [k, d] and b* [1, d]."""

    ws: np.ndarray
    us: np.ndarray
    we: np.ndarray
    ue: np.ndarray
    bs: np.ndarray
    be: np.ndarray

    @property
    def d(self) -> int:
        return self.ws.shape[1]

    @property
    def k(self) -> int:
        return self.ws.shape[0]

    @classmethod
    def load(cls, path: str | Path, hidden_size: int | None = None) -> EvidenceHead:
        """Read `evidence_head.pt` without executing pickled code; check names and shapes."""
        raw = load_tensors(path)
        if not isinstance(raw, dict) or not isinstance(raw.get("state_dict"), dict):
            raise TorchFileError(f"{path}: expected a dict with 'd', 'k' and 'state_dict'")
        sd = raw["state_dict"]
        missing = [f"{n}.weight" for n in _NAMES if f"{n}.weight" not in sd]
        if missing:
            raise TorchFileError(f"{path}: state_dict lacks {', '.join(missing)}")
        d, k = int(raw.get("d", sd["ws.weight"].shape[1])), int(raw.get("k", sd["ws.weight"].shape[0]))
        head = cls(*(np.asarray(sd[f"{n}.weight"], dtype=np.float32) for n in _NAMES))
        expected = {"ws": (k, d), "us": (k, d), "we": (k, d), "ue": (k, d), "bs": (1, d), "be": (1, d)}
        wrong = [
            f"{n} {getattr(head, n).shape} (expected {s})" for n, s in expected.items() if getattr(head, n).shape != s
        ]
        if wrong:
            raise TorchFileError(f"{path}: wrong shapes: {', '.join(wrong)}")
        if hidden_size is not None and d != hidden_size:
            raise TorchFileError(f"{path}: the head reads hidden size {d}, the model has {hidden_size}")
        return head

    def save(self, path: str | Path) -> None:
        save_tensors(path, {"d": self.d, "k": self.k, "state_dict": {f"{n}.weight": getattr(self, n) for n in _NAMES}})

    @classmethod
    def random(cls, d: int, k: int, seed: int) -> EvidenceHead:
        """A seeded synthetic head with the real layout (synthetic models; its spans carry no meaning)."""
        rng = np.random.Generator(np.random.PCG64([seed, 0xE1DE]))
        mats = [(rng.standard_normal((k, d), dtype=np.float32) * d**-0.5) for _ in range(4)]
        biases = [(rng.standard_normal((1, d), dtype=np.float32) * d**-0.5) for _ in range(2)]
        return cls(*mats, *biases)

    def log_scores(self, h: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and end log-probabilities over the n state tokens. h [n, d], q [d]; float32 throughout."""
        lh, lq = layer_norm(np.asarray(h, dtype=np.float32)), layer_norm(np.asarray(q, dtype=np.float32)[None, :])[0]
        scale = np.float32(np.sqrt(np.float32(self.k)))
        s = (lh @ self.ws.T) @ (self.us @ lq) / scale + lh @ self.bs[0]
        e = (lh @ self.we.T) @ (self.ue @ lq) / scale + lh @ self.be[0]
        return log_softmax(s), log_softmax(e)


def load_head(model_dir: str | Path, hidden_size: int) -> EvidenceHead | None:
    """The model directory's evidence head, or None when it has none (evidence is then refused)."""
    path = Path(model_dir) / HEAD_FILE
    return EvidenceHead.load(path, hidden_size) if path.is_file() else None


def layer_norm(x: np.ndarray) -> np.ndarray:
    """(x - mean) / sqrt(var + 1e-5) per row, population variance, no scale or shift; float32."""
    mean = x.mean(-1, keepdims=True, dtype=np.float32)
    var = ((x - mean) ** 2).mean(-1, keepdims=True, dtype=np.float32)
    return ((x - mean) / np.sqrt(var + np.float32(LN_EPS))).astype(np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    shifted = x - x.max()
    return (shifted - np.log(np.exp(shifted).sum(dtype=np.float32))).astype(np.float32)


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
