"""Where a request should run: the replica that already holds its state, unless that replica is busy.

The prefix tree only pays when questions about the same state meet in one replica's batch, so requests are routed
by their rendered state. Rendezvous (highest-random-weight) hashing gives every (state, replica) pair a score and
picks the best replica: adding or removing a replica moves only the states whose best replica changed (about 1/n
of them). When the preferred replica's queue is over a bound, the request falls back to the less loaded of two
random replicas (power of two choices), so one hot state cannot pile everything on one replica. A request whose
state is too short to be worth sharing goes straight to the power-of-two fallback.

Pure Python: the Ray router (`basal.ray_serve.router`) calls `rank_replicas`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from basal.core.request.plan import DecisionRequest

AFFINITY_MIN_CHARS = 256  # states shorter than this are not worth keeping together
ROUTER_MAX_QUEUE = 8  # requests queued on the preferred replica before new ones spill over

R = TypeVar("R")


def affinity_key(request: DecisionRequest, min_chars: int = AFFINITY_MIN_CHARS) -> str | None:
    """The request's rendered state and its languages (prompts of one language share a tree row), or None when
    the state is too short to be worth sharing."""
    items = [q.item for q in request.questions if q.needs_model]
    if not items:
        return None
    state = items[0].state_text
    if len(state) < min_chars:
        return None
    langs = ",".join(sorted({i.lang for i in items}))
    return f"{request.model}\x00{langs}\x00{state}"


def weight(key: str, replica: str) -> int:
    """Rendezvous weight of a replica for a key (stable across processes and runs)."""
    digest = hashlib.blake2b(f"{replica}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preferred(key: str, replicas: Sequence[R], name: Callable[[R], str]) -> R:
    return max(replicas, key=lambda r: weight(key, name(r)))


def two_choices(replicas: Sequence[R], rng: random.Random = random._inst) -> list[R]:  # type: ignore[attr-defined]
    """Two distinct random replicas (or the only one): the caller takes the less loaded."""
    if len(replicas) <= 2:
        return list(replicas)
    return rng.sample(list(replicas), 2)


def rank_replicas(
    key: str | None,
    replicas: Sequence[R],
    name: Callable[[R], str],
    queue_len: Callable[[R], int | None],
    max_queue: int = ROUTER_MAX_QUEUE,
    rng: random.Random = random._inst,  # type: ignore[attr-defined]
) -> list[list[R]]:
    """Ranks of replicas to try, best first (the Ray router probes each rank and takes its least loaded).

    With a key: [[preferred], two others] while the preferred replica's known queue is under `max_queue`
    (an unknown queue length counts as short: the router probes it); otherwise [two random]."""
    if not replicas:
        return []
    if key is None:
        return [two_choices(replicas, rng)]
    best = preferred(key, replicas, name)
    queued = queue_len(best)
    if queued is not None and queued >= max_queue:
        return [two_choices(replicas, rng)]
    others = [r for r in replicas if r is not best]
    return [[best], two_choices(others, rng)] if others else [[best]]
