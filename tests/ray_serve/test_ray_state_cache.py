"""The state cache behind the Ray front (2 CPU replicas of the demo model): state affinity sends every request on a
state to the replica that holds it, so the replicas' caches hit as one process's does. Slow: it starts Ray."""

from __future__ import annotations

import random

import httpx
import pytest

pytest.importorskip("ray")

from basal.ray_serve.app import start
from basal.serve.config import parse_config
from tests.servers import live_server, replica_stats

MODEL = "basal-synthetic-demo"
STATES = [f"Zgłoszenie {i}: klient pisze, że paczka nr {i} dotarła uszkodzona i żąda zwrotu. " * 5 for i in range(24)]


def zipf_states(n: int, seed: int = 0) -> list[str]:
    """`n` states drawn Zipf-like (exponent 1.1) from `STATES`: a few hot ones, a long tail."""
    rng = random.Random(seed)
    return rng.choices(STATES, weights=[1 / (i + 1) ** 1.1 for i in range(len(STATES))], k=n)


def cache_counts(engines) -> dict[str, dict[str, int]]:
    """Each replica's state cache lookups."""
    return replica_stats(engines.handles[MODEL])


@pytest.mark.slow
def test_affinity_keeps_the_hit_rate_of_one_process():
    from ray import serve

    drawn = zipf_states(60)
    engines = start(parse_config({"ray": {"replicas": 2}}))
    try:
        with live_server(engines) as url, httpx.Client(timeout=120) as client:
            for i, state in enumerate(drawn):  # one after another: no spill-over, every lookup counted
                body = {"model": MODEL, "state": state, "questions": {"q": {"type": "noul", "instructions": f"{i}?"}}}
                assert client.post(url + "/v1/basal", json=body).status_code == 200
        replicas = cache_counts(engines)
    finally:
        serve.shutdown()
    hits = sum(r["state_hits"] + r["state_partial_hits"] for r in replicas.values())
    misses = sum(r["state_misses"] for r in replicas.values())
    distinct = len(set(drawn))
    assert len(replicas) == 2 and all(r["state_misses"] > 0 for r in replicas.values())  # both hold states
    # each state is computed once, on its replica, and read there by every later request: one process's counts
    assert (hits, misses) == (len(drawn) - distinct, distinct)
    print(f"\nstate cache behind Ray, 2 replicas: hit rate {hits / len(drawn):.0%} ({hits}/{len(drawn)} requests)")
