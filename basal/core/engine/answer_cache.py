"""The exact-answer cache: a response computed once is served again for a byte-equivalent request.

Safe only because basal's answers are deterministic: the same request to the same model (version, calibration,
backend and dtype) gives the same bytes, apart from timings. The key is a SHA-256 over every input that can change
the answer (`answer_key`); a value is the answer's encoded bytes, split around its timing field so that a hit
reports its own time (`Stored`). Bounded in entries and in bytes (least recently used out first), each entry lives
`ttl_s` seconds. Plain Python, no HTTP: the front decides when to look up and store (`basal.api.decisions`).

Scope: with API keys, each key gets its own entries unless the operator shares them (`answer_cache_shared`). A hit
answers in well under a millisecond and a miss takes a forward pass, so a shared cache lets one client time
another's requests: whether someone else asked exactly this (docs/caches.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

ENTRY_OVERHEAD_BYTES = 256  # the key, the entry object and the dictionary slot, counted per entry
MARK_OVERHEAD_BYTES = 128  # a drift mark's tuple, its float and its two strings' headers


@dataclass(frozen=True, slots=True)
class Stored:
    """An answer as the front sends it: `head + <timing> + tail`, then `extra` (diagnostics), and the numbers that
    went into the response's headers and metrics. `head`/`tail` split the body at its one timing field (the
    basal dialect's `usage.latency_ms`); a body without one has it all in `head` and `timed` False."""

    head: bytes
    tail: bytes
    extra: bytes
    timed: bool
    input_tokens: int  # usage.input_tokens: the metrics count a hit's tokens as a miss's
    # (question, label, confidence) per answer: the drift series count a hit as its answer (basal.core.engine.drift)
    marks: tuple[tuple[str, str, float], ...] = ()

    @property
    def size(self) -> int:
        """Bytes the cache counts for this entry: its byte strings and marks plus a constant per entry."""
        marked = sum(len(q) + len(label) + MARK_OVERHEAD_BYTES for q, label, _ in self.marks)
        return len(self.head) + len(self.tail) + len(self.extra) + marked + ENTRY_OVERHEAD_BYTES

    def body(self, latency: bytes) -> bytes:
        """The response body with `latency` (the encoded number) as its timing field."""
        return self.head + (latency if self.timed else b"") + self.tail + self.extra


def split_timing(content: bytes, field: bytes = b'"latency_ms":') -> tuple[bytes, bytes, bool]:
    """Split an encoded response around the number of its last `field` (the usage object is encoded after every
    answer, so its field is the last one of that name even when an answer's legend reuses the name)."""
    at = content.rfind(field)
    if at < 0:
        return content, b"", False
    start = at + len(field)
    end = start
    while end < len(content) and content[end : end + 1] in b"0123456789.eE+-":
        end += 1
    return content[:start], content[end:], True


def answer_key(*parts: str | bytes) -> bytes:
    """A cache key over every part (lengths included, so no two part lists collide)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


@dataclass
class CacheCounts:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0  # `Cache-Control: no-cache`: not looked up (the fresh answer is stored)
    evictions: int = 0  # pushed out by the entry or byte bound
    expirations: int = 0  # found older than the time to live


class AnswerCache:
    """LRU over `Stored` answers, bounded by `max_entries` and `max_bytes`, with a time to live. Thread-safe."""

    def __init__(
        self, max_entries: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_s <= 0:
            raise ValueError("an answer cache needs positive max_entries, max_bytes and ttl_s")
        self.max_entries, self.max_bytes, self.ttl_s, self.clock = max_entries, max_bytes, ttl_s, clock
        self._entries: OrderedDict[bytes, tuple[float, Stored]] = OrderedDict()  # key -> (stored at, answer)
        self._lock = threading.Lock()
        self.bytes = 0
        self.counts = CacheCounts()
        # served name -> `model_identity`, kept by the front; `clear` (a reloaded calibration) forgets them too
        self.identities: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Stored | None:
        """The answer stored under `key` (now the most recently used), or None (a miss; expired entries go)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None and self.clock() - found[0] > self.ttl_s:
                self._drop(key)
                self.counts.expirations += 1
                found = None
            if found is None:
                self.counts.misses += 1
                return None
            self._entries.move_to_end(key)
            self.counts.hits += 1
            return found[1]

    def bypass(self) -> None:
        with self._lock:
            self.counts.bypasses += 1

    def put(self, key: bytes, stored: Stored) -> None:
        """Keep `stored` under `key`; the least recently used entries go until both bounds hold. An answer larger
        than the whole byte budget is not kept."""
        if stored.size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (self.clock(), stored)
            self.bytes += stored.size
            while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
                self.counts.evictions += 1

    def clear(self) -> None:
        """Forget every answer (a model or calibration changed)."""
        with self._lock:
            self._entries.clear()
            self.identities.clear()
            self.bytes = 0

    def _drop(self, key: bytes) -> None:
        _, stored = self._entries.pop(key)
        self.bytes -= stored.size


def model_identity(name: str, version: str, calibration: object, compute: dict[str, object]) -> bytes:
    """What of a served model decides its answers' bytes: its name and version, the calibration's content, and the
    backend, device and dtype that compute it."""
    cal = dataclasses.asdict(calibration) if dataclasses.is_dataclass(calibration) else calibration
    return answer_key(
        name,
        version,
        json.dumps(cal, sort_keys=True, default=str),
        *(str(compute.get(k, "")) for k in ("backend", "device", "dtype")),
    )


def request_key(dialect: str, scope: str, identity: bytes, diagnostics: bool, encoding: str, body: bytes) -> bytes:
    """The key of one request: its dialect, its scope (an API key's digest, or "shared"), the model's identity, the
    options outside the body that change the answer (diagnostics), and the body's bytes as sent (with their
    Content-Encoding)."""
    return answer_key(dialect, scope, identity, b"1" if diagnostics else b"0", encoding, body)
