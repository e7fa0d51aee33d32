"""State-affinity routing as pure logic: stable preferences, few moves when a replica joins, spill when busy."""

from __future__ import annotations

import random

from basal.core.request.dialects import parse_systemone
from basal.ray_serve.affinity import affinity_key, preferred, rank_replicas

REPLICAS = [f"r{i}" for i in range(4)]
LONG = "Klient zgłasza, że paczka nr 77 dotarła uszkodzona i żąda zwrotu pieniędzy. " * 5


def request(state: str, instructions: str = "Czy zwrot?"):
    raw = {"model": "m", "state": state, "questions": {"q": {"type": "noul", "instructions": instructions}}}
    return parse_systemone(raw, lambda name: "m")


def test_the_key_is_the_rendered_state_and_its_languages():
    a, b = affinity_key(request(LONG)), affinity_key(request(LONG, "Another question?"))
    assert a == b and LONG in a  # other questions on the same state meet on the same replica
    assert affinity_key(request("Short state.")) is None  # not worth sharing: least-loaded replica
    assert affinity_key(request(LONG.replace("ż", "z").replace("ą", "a"))) != a


def test_same_key_same_replica_and_keys_spread():
    keys = [f"state {i}" for i in range(200)]
    chosen = [preferred(k, REPLICAS, str) for k in keys]
    assert chosen == [preferred(k, list(reversed(REPLICAS)), str) for k in keys]  # order of the list is irrelevant
    counts = {r: chosen.count(r) for r in REPLICAS}
    assert min(counts.values()) > 25  # 50 expected each


def test_adding_a_replica_moves_only_the_states_it_takes_over():
    keys = [f"state {i}" for i in range(400)]
    before = {k: preferred(k, REPLICAS, str) for k in keys}
    after = {k: preferred(k, [*REPLICAS, "r4"], str) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "r4" for k in moved)  # nothing moves between the old replicas
    assert 40 < len(moved) < 130  # about 1/5 of the states


def test_a_busy_preferred_replica_spills_to_two_choices():
    key = "state 1"
    best = preferred(key, REPLICAS, str)
    queue = dict.fromkeys(REPLICAS, 0)
    ranks = rank_replicas(key, REPLICAS, str, queue.get, max_queue=8, rng=random.Random(0))
    assert ranks[0] == [best] and best not in ranks[1] and len(ranks[1]) == 2
    queue[best] = 8
    ranks = rank_replicas(key, REPLICAS, str, queue.get, max_queue=8, rng=random.Random(0))
    assert len(ranks) == 1 and len(ranks[0]) == 2  # power of two choices over all replicas
    assert rank_replicas(key, REPLICAS, str, lambda r: None, max_queue=8)[0] == [best]  # unknown: probe it


def test_no_key_goes_to_the_less_loaded_of_two():
    ranks = rank_replicas(None, REPLICAS, str, lambda r: 0, rng=random.Random(1))
    assert len(ranks) == 1 and len(set(ranks[0])) == 2
    assert rank_replicas(None, ["only"], str, lambda r: 0) == [["only"]]
    assert rank_replicas("k", [], str, lambda r: 0) == []
