"""Ray Serve scale-out: state-affinity routing vs Ray's default power-of-two router vs one replica.

A mixed workload where many requests share states (questions arriving one request at a time about a few long
documents) runs against the basal HTTP front over Ray with 2 CPU replicas. Reported per router: requests/s,
packed vs prompt tokens summed over the replicas (how much the prefix tree shared), and the replica spread. The
affinity router should keep the packed-token ratio of one process; the default router splits each state's
requests over both replicas and loses sharing. Also: the added p50 of one request over Ray vs one process.

    python -m bench.compare.ray_affinity [--preset mini --layers 2] [--requests 48] [--clients 8]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from basal.benchsuite.workloads import state_of_tokens
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.serve.config import parse_config
from tests.servers import live_server, make_engines, replica_stats


def workload(model: ModelDir, n: int, states: int, seed: int = 0) -> list[dict]:
    """`n` requests of two questions each, about one of `states` documents of ~384 tokens (chosen at random)."""
    rng = random.Random(seed)
    docs = [state_of_tokens(model.tokenizer, 384, "pl" if i % 2 else "en", seed + i) for i in range(states)]
    return [
        {
            "model": "jev-latest",
            "state": docs[rng.randrange(states)],
            "questions": {f"q{j}": {"type": "noul", "instructions": f"Question {i}.{j}?"} for j in range(2)},
        }
        for i in range(n)
    ]


def drive(url: str, requests: list[dict], clients: int) -> tuple[float, list[float], list[str]]:
    latencies, replicas = [], []

    def one(body: dict) -> None:
        t = time.perf_counter()
        r = httpx.post(url + "/v1/systemone", json=body, timeout=600)
        r.raise_for_status()
        latencies.append(time.perf_counter() - t)
        replicas.append(r.headers.get("x-basal-replica", "-"))

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, requests))
    return time.perf_counter() - started, latencies, replicas


def run_router(model_dir: Path, router: str, requests: list[dict], clients: int) -> dict:
    from ray import serve

    from basal.ray_serve.app import start

    config = parse_config({"models": [{"path": str(model_dir)}], "ray": {"replicas": 2, "router": router}})
    engines = start(config)
    name = next(iter(engines.handles))
    handle = engines.handles[name]
    try:
        with live_server(engines) as url:
            drive(url, requests[:4], 2)  # warm-up
            before = _totals(handle)
            seconds, latencies, replicas = drive(url, requests, clients)
            after = _totals(handle)
            single = [drive(url, requests[i : i + 1], 1)[1][0] for i in range(8)]
    finally:
        serve.shutdown()
    packed = after["packed_tokens"] - before["packed_tokens"]
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    return {
        "engine": f"Ray, 2 replicas, {router} router",
        "requests_per_s": len(requests) / seconds,
        "p50_ms": statistics.median(latencies) * 1000,
        "packed_over_prompt": packed / prompt if prompt else float("nan"),
        "replica_spread": {r: replicas.count(r) for r in set(replicas)},
        "single_request_p50_ms": statistics.median(single) * 1000,
    }


def _totals(handle) -> dict[str, int]:
    """Sum of the replicas' counters."""
    seen = replica_stats(handle)
    return {k: sum(s[k] for s in seen.values()) for k in ("packed_tokens", "prompt_tokens")}


def run_single(model_dir: Path, requests: list[dict], clients: int) -> dict:
    model = ModelDir.load(model_dir)
    engines = make_engines(model)
    engine = next(iter(engines.engines.values()))
    with live_server(engines) as url:
        drive(url, requests[:4], 2)
        packed0, prompt0 = engine.packed_tokens, engine.prompt_tokens
        seconds, latencies, _ = drive(url, requests, clients)
        single = [drive(url, requests[i : i + 1], 1)[1][0] for i in range(8)]
    engines.close()
    return {
        "engine": "one process",
        "requests_per_s": len(requests) / seconds,
        "p50_ms": statistics.median(latencies) * 1000,
        "packed_over_prompt": (engine.packed_tokens - packed0) / (engine.prompt_tokens - prompt0),
        "single_request_p50_ms": statistics.median(single) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--states", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--out", default="bench/results/ray_affinity.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = synth_model(Path(tmp) / "m", a.preset, layers=a.layers)
        requests = workload(ModelDir.load(model_dir), a.requests, a.states)
        rows = [run_single(model_dir, requests, a.clients)]
        for router in ("affinity", "power_of_two"):
            rows.append(run_router(model_dir, router, requests, a.clients))
    print("| engine | requests/s | p50 ms | packed / prompt tokens | replica spread | one request alone, p50 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        spread = ", ".join(str(v) for v in sorted(r.get("replica_spread", {}).values())) or "-"
        cells = [r["engine"], f"{r['requests_per_s']:.2f}", f"{r['p50_ms']:.0f}", f"{r['packed_over_prompt']:.3f}"]
        print("| " + " | ".join([*cells, spread, f"{r['single_request_p50_ms']:.0f}"]) + " |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
