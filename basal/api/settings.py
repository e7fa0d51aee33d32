"""What the HTTP layer is told at its start (`basal serve` builds it from the configuration)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from basal.api.http.body import TransitBytes
from basal.api.http.capture import Capture
from basal.core.engine.answer_cache import AnswerCache
from basal.core.request.limits import DEFAULT_LIMITS, Limits
from basal.observability.tracing import Tracer


@dataclass
class ApiSettings:
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 16 << 20
    release_date: str = "2026-10-05"
    metrics: bool = False
    descriptions: dict[str, str] = field(default_factory=dict)
    limits: Limits = DEFAULT_LIMITS
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (none: CORS off)
    public_metrics_and_schema: bool = False  # /metrics and /schema without a key even when keys are set
    access_log: bool = False  # one line per request (basal.access), in the process's log format
    tracer: Tracer | None = None  # OpenTelemetry spans (the otel extra; None: off)
    transit: TransitBytes = field(default_factory=TransitBytes)  # bodies being received (not a setting: a count)
    capture: Capture | None = None  # a sample of valid requests to JSONL (docs/replay.md); None: off
    answer_cache: AnswerCache | None = None  # the exact-answer cache (None: off)
    caches_shared: bool = False  # with api_keys: both caches shared by every key (else one scope per key)
    admin_keys: tuple[str, ...] = ()  # keys that also see every key's files and batches (added to api_keys)
    batches_shared: bool = False  # with api_keys: every key sees every file and batch (else each its own)
    admin_owners: frozenset[str] = field(init=False, default=frozenset())  # the admin keys' digests

    def __post_init__(self) -> None:
        self.api_keys = tuple(dict.fromkeys((*self.api_keys, *self.admin_keys)))  # an admin key is a key
        self.admin_owners = frozenset(key_digest(k.encode("utf-8")) for k in self.admin_keys)

    def cache_scope(self, owner: str | None) -> str:
        """The caches' scope of work done for `owner` (a key's digest, None for no key): its own, unless the
        caches are shared or no keys are set ("": one scope)."""
        return "" if owner is None or not self.api_keys or self.caches_shared else owner


def key_digest(key: bytes) -> str:
    """Who a key is, as stored and compared: its SHA-256 (never the key itself), the owner of the files and
    batches it creates and the scope of its cache entries."""
    return hashlib.sha256(key).hexdigest()
