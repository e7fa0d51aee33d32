"""Shadow traffic's cost to the primary: online latency (p50, p99) and throughput with a shadow model at sample 0.1
and 1.0 against no shadow, 32 clients, in one process, alternating.

    python -m bench.lab.shadow_speed                     # mini shapes cut to 1 layer, both models, f32, torch CPU
    python -m bench.lab.shadow_speed --requests 8 --reps 1

The primary and the shadow have the same shapes (other seeds): at sample 1.0 the device does twice the work, and
what the table shows is how much of it reaches the primary. Copies run on the background lane (behind every online
request) and hold no in-flight place; the primary's latency is measured from the call to its answer, through the
front `basal serve` builds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import state_of_tokens
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.engine.shadow import Shadow, ShadowFront
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_basal
from basal.core.request.model_names import ServedModels
from bench import report

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
    "team": {"type": "choice", "instructions": "Who handles it?", "criteria": ["billing", "technical", "sales"]},
}


def build(root: Path, layers: int) -> Engines:
    metrics, gate = Metrics(), Gate()
    engines = {}
    for name, seed in (("primary", 1), ("candidate", 2)):
        path = synth_model(root / name, "mini", layers=layers, seed=seed)
        meta = json.loads((path / "basal.json").read_text())
        (path / "basal.json").write_text(json.dumps({**meta, "name": name}))
        model = ModelDir.load(path)
        engines[name] = Engine(name, Pipeline(model, TorchBackend.load(model, dtype="f32")), gate, metrics)
    front = Engines(engines, "primary", metrics)
    front.start()
    return front


async def clients(front, requests, n: int) -> tuple[list[float], float]:
    """Every request by `n` clients at once -> each request's latency (s) and the wall time."""
    queue = list(requests)
    latencies: list[float] = []

    async def client() -> None:
        while queue:
            request = queue.pop()
            t0 = time.perf_counter()
            await front.run(request)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(n)))
    return latencies, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="requests per client and run")
    ap.add_argument("--state-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="bench/results/shadow_speed.json")
    a = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory()
    engines = build(Path(tmp.name), a.layers)
    tokenizer = ModelDir.load(Path(tmp.name) / "primary").tokenizer
    n = a.clients * a.requests
    states = [state_of_tokens(tokenizer, a.state_tokens, "en", seed=i) for i in range(n)]
    resolve = ServedModels(tuple(engines.names), "primary")
    requests = [parse_basal({"model": "primary", "state": s, "questions": QUESTIONS}, resolve) for s in states]
    fronts = {f"sample {s:g}": ShadowFront(engines, [Shadow("primary", "candidate", s, queue=4 * n)]) for s in (0.1, 1)}
    ways = {"off": engines, **fronts}
    asyncio.run(clients(engines, requests[: a.clients], a.clients))  # warm-up

    runs: dict[str, list[tuple[list[float], float]]] = {w: [] for w in ways}
    for _ in tqdm(range(a.reps), desc="alternating runs"):
        for way, front in ways.items():

            async def one(front=front):
                out = await clients(front, requests, a.clients)
                if isinstance(front, ShadowFront):
                    await front.settle()  # the copies end before the next way starts
                return out

            runs[way].append(asyncio.run(one()))
    engines.close()
    rows = {}
    for way, results in runs.items():
        lat = np.array([x for latencies, _ in results for x in latencies]) * 1000
        rows[way] = {
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "requests_per_s": max(n / wall for _, wall in results),
        }
    compared = {w: fronts[w].summary()["shadows"][0]["requests"] for w in fronts}
    result = {"machine": report.machine(), "layers": a.layers, "clients": a.clients, "requests": n, "rows": rows,
              "shadow_requests": compared}  # fmt: skip
    report.write_json(a.out, result)
    print(f"\nmini shapes cut to {a.layers} layer(s), f32, torch CPU; {a.clients} clients, {n} requests a run, "
          f"~{a.state_tokens}-token states, {a.reps} alternating runs\n")  # fmt: skip
    print("| shadow | p50 ms | p99 ms | p99 vs off | requests/s | vs off |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    off = rows["off"]
    for way, r in rows.items():
        print(
            f"| {way} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['p99_ms'] / off['p99_ms']:.2f}× | "
            f"{r['requests_per_s']:.1f} | {r['requests_per_s'] / off['requests_per_s']:.2f}× |"
        )
    print(f"\nshadow copies: {compared}")
    tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
