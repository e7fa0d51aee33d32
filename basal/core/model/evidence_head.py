"""The evidence pointer head of a model directory (`evidence_head.pt`): its six matrices and the start/end scores it
gives the state tokens. Plain numpy, no msgspec: the GPU image's imports reach it through the model directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from basal.core.model.torch_file import TorchFileError, load_tensors, save_tensors

HEAD_FILE = "evidence_head.pt"
HEAD_RANK = 256  # k of the shipped heads (the head class's default)
LN_EPS = 1e-5
_NAMES = ("ws", "us", "we", "ue", "bs", "be")


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
