"""Under load nothing is lost or mixed up: 32 concurrent clients, every full answer equals the same request's
answer when it was sent alone (bit for bit: msgspec writes the shortest repr, so equal text = equal floats)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.servers import live_server, make_engines

STATES = [
    "Klient zgłasza, że paczka nr 77 dotarła uszkodzona i żąda zwrotu pieniędzy.",
    "The customer was charged twice for order 5512 and asks for a refund.",
    {"ticket": "Faktura bez numeru NIP", "amount": 1299.0, "vip": True},
]


def _requests(n: int) -> list[tuple[str, dict]]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        state = STATES[i % len(STATES)]
        questions = {}
        for j in range(rng.randint(1, 5)):
            kind = rng.choice(["noul", "choice", "score"])
            if kind == "noul":
                questions[f"q{j}"] = {"type": "noul", "instructions": f"Is point {j + i} true?"}
            elif kind == "choice":
                questions[f"q{j}"] = {
                    "type": "choice",
                    "instructions": "Which?",
                    "criteria": {f"o{k}": f"option {k + i}" for k in range(rng.randint(2, 10))},
                }
            else:
                questions[f"q{j}"] = {
                    "type": "score",
                    "instructions": "How much?",
                    "criteria": [f"level {k}" for k in range(rng.randint(2, 6))],
                }
        path = "/v1/systemone" if i % 4 else "/v1/basal"
        out.append((path, {"model": "basal-synthetic-demo", "state": state, "questions": questions}))
    return out


def test_32_concurrent_clients_get_their_own_answers_bit_for_bit(demo_model):
    engines = make_engines(demo_model)
    requests = _requests(16)
    with live_server(engines) as url, httpx.Client(base_url=url, timeout=60) as client:
        alone = [client.post(path, json=body).json()["answers"] for path, body in requests]

        def worker(seed: int) -> list[tuple[int, dict, int]]:
            rng = random.Random(seed)
            with httpx.Client(base_url=url, timeout=120) as c:
                out = []
                for _ in range(6):
                    i = rng.randrange(len(requests))
                    r = c.post(requests[i][0], json=requests[i][1])
                    assert r.status_code == 200, r.text
                    out.append((i, r.json()["answers"], int(r.headers["x-basal-batch-requests"])))
                return out

        with ThreadPoolExecutor(32) as pool:
            results = [x for part in pool.map(worker, range(32)) for x in part]
    assert len(results) == 32 * 6
    mismatched = [i for i, answers, _ in results if answers != alone[i]]
    assert not mismatched
    assert max(batch for _, _, batch in results) > 1  # requests really were batched together
