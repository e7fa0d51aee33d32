"""Who runs next: the queue of one lane of one model, its order (HRRN or FIFO) and admission by token budget.

The only place that decides which jobs share a pass (backends never do). Cost is counted in packed tokens — the
tokens the prefix tree will actually compute, shared prefixes once, across requests too, cached prefixes (the
template's, a cached state's) not at all.

HRRN (highest response ratio next): priority = (waited + estimated) / estimated, with estimated = cost / rate and
rate an exponential average of packed tokens/s of recent passes. Short requests go first; a long one's ratio
grows while it waits, so it is never starved. FIFO keeps arrival order.
"""

from __future__ import annotations

import contextvars
import enum
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from basal.core.packing.tree import TokenizedQuestion, TrieSize
from basal.core.request.plan import DecisionRequest

INITIAL_RATE = 3000.0  # packed tokens/s before the first pass was measured


class Policy(enum.Enum):
    HRRN = "hrrn"
    FIFO = "fifo"


@dataclass(eq=False)
class Job:
    """One HTTP request inside the engine."""

    request: DecisionRequest
    tokenized: list[TokenizedQuestion]  # the prompts of the round to run next (what admission packs by)
    cost: int  # packed tokens of every round still to run (a later round's are estimated until it is known)
    finish: Callable[[Any], None]  # called once from a lane thread with the result or an exception
    cancelled: Callable[[], bool] = lambda: False
    arrival: float = field(default_factory=time.perf_counter)
    seq: int = field(default_factory=itertools.count().__next__)
    # filled when its pass runs
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    pass_requests: int = 0  # requests in its (last) pass
    passes: int = 0  # passes it has been in (a choice with 11..255 options needs a second one)
    state: Hashable = None  # the pipeline's state of the request (`seam.Admitted.state`), never read here
    background: bool = False  # a Batch API line: runs only when no online job waits in its lane, in arrival order
    context: contextvars.Context | None = None  # the HTTP task's context vars: a lane's log lines carry its id

    def log(self, logger: logging.Logger, level: int, message: str, *args: Any, **kwargs: Any) -> None:
        """Log a line about this job from a lane thread, as if from its request's task (its request id)."""
        if self.context is None:
            logger.log(level, message, *args, **kwargs)
        else:
            self.context.run(logger.log, level, message, *args, **kwargs)


class JobQueue:
    """Waiting jobs of one lane. Not thread-safe: the engine guards it with its lane's condition."""

    def __init__(
        self,
        policy: Policy = Policy.HRRN,
        prefix_len: dict[str, int] | None = None,
        cached_prefix: Callable[[TokenizedQuestion], tuple[str, int] | None] = lambda t: None,
    ):
        """`prefix_len`: per language, the template prefix's tokens; `cached_prefix(t)`: the cached state a question
        reads now, and its tokens (template included), or None (`Seam.cached_prefix`)."""
        self.policy = policy
        self.rate = INITIAL_RATE
        self.prefix_len = prefix_len or {}
        self.cached_prefix = cached_prefix
        self._jobs: list[Job] = []

    def __len__(self) -> int:
        return len(self._jobs)

    def push(self, job: Job) -> None:
        self._jobs.append(job)

    def observe(self, packed_tokens: int, seconds: float) -> None:
        """Update the token rate from a finished pass (passes under 1 ms say nothing)."""
        if seconds > 0.001:
            self.rate = 0.8 * self.rate + 0.2 * (packed_tokens / seconds)

    def priority(self, job: Job, now: float) -> tuple[bool, float, int, int]:
        """Sort key, smallest first: online jobs before background ones; FIFO by arrival; HRRN by response ratio,
        then cheaper, then older. Background jobs keep arrival order, so the lines of one state, submitted one
        after another, are admitted together and the prefix tree computes the state once."""
        if self.policy is Policy.FIFO or job.background:
            return (job.background, 0.0, 0, job.seq)
        estimated = max(job.cost, 1) / self.rate
        return (False, -(now - job.arrival + estimated) / estimated, job.cost, job.seq)

    def drop_cancelled(self) -> list[Job]:
        gone = [j for j in self._jobs if j.cancelled()]
        if gone:
            self._jobs = [j for j in self._jobs if j not in gone]
        return gone

    def admit(self, max_tokens: int, now: float | None = None) -> list[Job]:
        """The first job in order always; then every waiting job that keeps the pass within `max_tokens`
        packed tokens (prompts shared with jobs already admitted count once; the tokens of a cached state, as of the
        template prefix, not at all: the packer puts the questions on one cached state in a row of their own after
        it). No waiting for more work. Online and background jobs never share a pass: an online job does not wait
        for Batch API lines computed beside it."""
        if not self._jobs:
            return []
        now = time.perf_counter() if now is None else now
        ordered = sorted(self._jobs, key=lambda j: self.priority(j, now))
        sizes: dict[str, TrieSize] = {}  # a trie per cached prefix the rows start after (a language, a state)
        skip: dict[str, int] = {}  # that prefix's tokens, which every prompt of its trie starts with
        chosen: list[Job] = []
        for job in ordered:
            if chosen and job.background != chosen[0].background:
                break  # sorted: every job after the first background one is background too
            added = []
            for t in job.tokenized:
                cached = self.cached_prefix(t)
                row, skip[row] = cached if cached is not None else (t.lang, self.prefix_len.get(t.lang, 0))
                size = sizes.setdefault(row, TrieSize())
                for p in t.ids:
                    size.add(p)
                    added.append((size, p))
            total = sum(s.tokens - skip[row] for row, s in sizes.items() if s.tokens)
            if chosen and total > max_tokens:
                for size, p in reversed(added):
                    size.remove(p)
                continue
            chosen.append(job)
            if total >= max_tokens:
                break
        taken = set(map(id, chosen))
        self._jobs = [j for j in self._jobs if id(j) not in taken]
        return chosen
