"""Mixed traffic on the state cache: clients asking about states drawn Zipf-like from a large set (a few hot states,
a long tail), one question a request; decisions/s and the hit rate with the cache on and off, in one process.

    python -m bench.lab.state_cache_mixed                          # 32 clients, 1,000 states, mini cut to 1 layer
    python -m bench.lab.state_cache_mixed --requests 640 --zipf 1.2
    python -m bench.lab.state_cache_mixed --layers 4 --reps 2    # off, on, off, on: the best of each

The same request sequence runs against a pipeline with `state_cache_mb` 0 and one with the cache on (two engines
on one model, one at a time, a fresh cold cache each run); answers are compared bitwise. `--reps` alternates the
two and keeps each one's best run: on a shared machine a burst of other work slows one run, not the best of two.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

from basal.backends.cuda.backend import TorchBackend
from basal.benchsuite.workloads import state_of_tokens
from basal.core.engine.engine import Engine
from basal.core.engine.engines import Engines
from basal.core.engine.gate import Gate
from basal.core.engine.metrics import Metrics
from basal.core.engine.pipeline import Pipeline
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_basal
from basal.core.request.model_names import ServedModels
from bench import report

QUESTIONS = ["Is it urgent?", "Is it about money?", "Is the customer angry?", "Does it need a refund?"]


def mixed_bodies(tokenizer, states: int, state_tokens: int, requests: int, zipf: float) -> tuple[dict, list[dict]]:
    """The workload, the same for every seed-0 run: `requests` one-question `/v1/basal` bodies on states drawn with
    popularity 1/rank^`zipf` from `states` -> the distinct states asked (index -> text) and the bodies in order."""
    rng = random.Random(0)
    weights = 1.0 / np.arange(1, states + 1) ** zipf
    drawn = rng.choices(range(states), weights=weights.tolist(), k=requests)
    texts = {s: state_of_tokens(tokenizer, state_tokens, "en", seed=s) for s in set(drawn)}
    bodies = [
        {"state": texts[s], "questions": {"q": {"type": "noul", "instructions": rng.choice(QUESTIONS)}}} for s in drawn
    ]
    return texts, bodies


def engines_for(model: ModelDir, state_cache_mb: float) -> Engines:
    metrics = Metrics()
    pipeline = Pipeline(model, TorchBackend.load(model, dtype="f32"), state_cache_mb=state_cache_mb)
    front = Engines({model.name: Engine(model.name, pipeline, Gate(), metrics)}, model.name, metrics)
    front.start()
    return front


async def drive(front: Engines, requests, clients: int) -> tuple[list, float]:
    queue = list(enumerate(requests))
    out: list = [None] * len(requests)

    async def client() -> None:
        while queue:
            i, request = queue.pop(0)
            out[i] = await front.run(request)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return out, time.perf_counter() - t0


def workload_args(ap: argparse.ArgumentParser) -> None:
    """The flags that make the workload (the model's depth, `mixed_bodies`'s arguments, the clients) and the runs:
    the same in process and over HTTP (`caches_mixed_http.py`)."""
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--states", type=int, default=1000)
    ap.add_argument("--state-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--zipf", type=float, default=1.1, help="the exponent of the states' popularity")
    ap.add_argument("--reps", type=int, default=1, help="runs of each, alternating; the best one counts")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_args(ap)
    ap.add_argument("--state-cache-mb", type=float, default=1024)
    ap.add_argument("--out", default="bench/results/state_cache_mixed.json")
    a = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory()
    model = ModelDir.load(synth_model(Path(tmp.name) / "mini", "mini", layers=a.layers))
    texts, bodies = mixed_bodies(model.tokenizer, a.states, a.state_tokens, a.requests, a.zipf)
    resolve = ServedModels((model.name,), model.name)
    requests = [parse_basal(body, resolve) for body in bodies]
    rows: dict[str, dict] = {}
    answers: dict[str, list[bytes]] = {}
    for _ in range(a.reps):
        for way, mb in (("off", 0.0), ("on", a.state_cache_mb)):
            front = engines_for(model, mb)
            asyncio.run(drive(front, requests[:4], 4))  # warm-up (these states are then cached when on)
            results, wall = asyncio.run(drive(front, requests, a.clients))
            engine = front.engines[model.name]
            cache = engine.pipeline.state_cache
            stats = cache.stats() if cache is not None else {}
            computed = engine.packed_tokens  # tokens the passes computed (warm-up included): what the load cannot skew
            front.close()
            got = [msgspec.json.encode(r.response.answers) for r in results]
            if answers.setdefault(way, got) != got:
                raise SystemExit(f"two runs with the cache {way} answered differently: a bug")
            runs = [*rows.get(way, {}).get("runs_s", []), wall]
            if way not in rows or wall < rows[way]["seconds"]:
                rows[way] = {"decisions_per_s": a.requests / wall, "seconds": wall, "cache": stats}
                rows[way]["computed"] = computed
            rows[way]["runs_s"] = runs
    same = sum(x == y for x, y in zip(answers["off"], answers["on"], strict=True))
    on = rows["on"]["cache"]
    looked = on.get("hits_total", 0) + on.get("partial_hits_total", 0) + on.get("misses_total", 0)
    result = {
        "machine": report.machine(),
        "states": a.states,
        "distinct_states_asked": len(texts),
        "requests": a.requests,
        "clients": a.clients,
        "zipf": a.zipf,
        "rows": rows,
        "hit_rate": (on.get("hits_total", 0) + on.get("partial_hits_total", 0)) / looked if looked else 0.0,
        "throughput_ratio": rows["on"]["decisions_per_s"] / rows["off"]["decisions_per_s"],
        "computed_ratio": rows["off"]["computed"] / rows["on"]["computed"],
        "identical_answers": f"{same}/{a.requests}",
    }
    report.write_json(a.out, result)
    print(
        f"\nmini shapes cut to {a.layers} layer(s), f32, torch CPU; {a.requests} requests from {a.clients} clients "
        f"over {a.states} states (Zipf {a.zipf}: {len(texts)} distinct asked), ~{a.state_tokens}-token states\n"
        f"cache off {rows['off']['decisions_per_s']:.1f} decisions/s, on {rows['on']['decisions_per_s']:.1f}: "
        f"{result['throughput_ratio']:.2f}×; hit rate {result['hit_rate']:.0%}; tokens computed off "
        f"{rows['off']['computed']:,}, on {rows['on']['computed']:,} ({result['computed_ratio']:.2f}× fewer); "
        f"answers bitwise equal {same}/{a.requests}"
    )
    tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
