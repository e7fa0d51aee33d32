"""Mixed traffic as a user of `basal serve` sees it: 32 HTTP clients over 1,000 states drawn Zipf-like, one question
a request, against a server with both caches off and one with its defaults (the state cache and the exact-answer
cache on); decisions/s, each cache's hits, and the answers compared byte for byte.

    python -m bench.lab.caches_mixed_http                              # mini shapes cut to 1 layer, 640 requests
    python -m bench.lab.caches_mixed_http --layers 1 --reps 2          # off, on, off, on: the best of each
    python -m bench.lab.caches_mixed_http --layers 4 --reps 1 --requests 320
    python -m bench.lab.caches_mixed_http --ways off,answer,state,on   # also each cache alone: which gives what
    python -m bench.lab.caches_mixed_http --warm 640                   # a server that has been running: see below

The requests are `bench/lab/state_cache_mixed.py`'s (the same states, questions and order), sent as `/v1/basal`
bodies by `--clients` coroutines sharing one keep-alive `httpx.AsyncClient` to a `basal serve` child on a free
loopback port (f32, torch CPU), a fresh child (cold caches) for every run. "off" is `--state-cache-mb 0
--answer-cache-entries 0`; "on" is the defaults; `--ways` adds "answer" (the answer cache
alone) and "state" (the state cache alone). Both warm up on the first 4 requests, as the in-process bench does.
`--warm N` first sends N more requests of the same draw, untimed, to every server (the same N to each), and times
the `--requests` after them: a server that has been running, whose caches hold what the traffic so far brought,
instead of one started cold for the run; the states new to the timed part are counted apart.
The answer cache's share is read from each response's `x-basal-cache` header, the state cache's counts from
/metrics (the timed run's deltas). Answers on and off must be equal byte for byte once `usage.latency_ms` (a timing)
and `usage.cached_tokens` (present only with the state cache on) are taken out (docs/caches.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from pathlib import Path

import httpx

from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from bench import report
from bench.compare.online_with_batch import start
from bench.lab.http_speed import metric_total
from bench.lab.state_cache_mixed import mixed_bodies, workload_args

WAYS = {  # `basal serve` flags per way: both caches off, one of them on, the defaults (both on)
    "off": ["--state-cache-mb", "0", "--answer-cache-entries", "0"],
    "answer": ["--state-cache-mb", "0"],
    "state": ["--answer-cache-entries", "0"],
    "on": [],
}
SERIES = ("hits", "partial_hits", "misses", "computed_tokens")
_VARIABLE = re.compile(rb',"(?:latency_ms|cached_tokens)":[0-9.eE+-]+')  # never first in `usage`


def comparable(body: bytes) -> bytes:
    """A response's bytes without the fields that may differ on vs off: the timing and the state cache's count."""
    return _VARIABLE.sub(b"", body)


def state_cache_counts(client: httpx.Client) -> dict[str, float]:
    """The server's `basal_state_cache_*_total` counters, summed over models (a missing series reads 0)."""
    text = client.get("/metrics").text
    return {name: metric_total(text, f"basal_state_cache_{name}_total") for name in SERIES}


async def drive(url: str, bodies: list[bytes], clients: int) -> tuple[list[tuple[int, bytes, str]], float]:
    """Every body by `clients` coroutines at once -> (status, response bytes, x-basal-cache) in order, wall time."""
    out: list = [None] * len(bodies)
    todo = iter(range(len(bodies)))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as http:

        async def client() -> None:
            for i in todo:  # one shared iterator: each body is sent once
                r = await http.post("/v1/basal", content=bodies[i], headers=headers)
                out[i] = (r.status_code, r.content, r.headers.get("x-basal-cache", ""))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return out, wall


def run_once(model: Path, home: Path, way: str, bodies: list[bytes], clients: int, warm: list[bytes]) -> dict:
    """One fresh server child with `way`'s flags: warm-up (the first 4 bodies, then `warm`), the timed run, its
    counters."""
    proc, url = start(str(model), home, ["--metrics", *WAYS[way]], None)
    try:
        asyncio.run(drive(url, bodies[:4], 4))  # warm-up (these states and answers are then cached when on)
        if warm:
            asyncio.run(drive(url, warm, clients))
        with httpx.Client(base_url=url, timeout=60) as http:
            before = state_cache_counts(http)
            results, wall = asyncio.run(drive(url, bodies, clients))
            after = state_cache_counts(http)
    finally:
        proc.terminate()
        proc.wait(60)
    bad = [(s, b[:200]) for s, b, _ in results if s != 200]
    if bad:
        raise SystemExit(f"{len(bad)} requests failed with cache {way}, e.g. {bad[0]}")
    cached_tokens = sum(json.loads(b)["usage"].get("cached_tokens", 0) for _, b, _ in results)
    return {
        "wall": wall,
        "answers": [comparable(b) for _, b, _ in results],
        "answer_cache": {h or "none": sum(x == h for _, _, x in results) for h in {x for _, _, x in results}},
        "state_cache": {k: after[k] - before[k] for k in SERIES},
        "cached_tokens": cached_tokens,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_args(ap)
    ap.add_argument("--warm", type=int, default=0, help="requests of the same draw sent untimed before the timed ones")
    ap.add_argument("--ways", default="off,on", help=f"comma list of {', '.join(WAYS)}; off and on always run")
    ap.add_argument("--out", default="bench/results/caches_mixed_http.json")
    a = ap.parse_args(argv)
    ways = [w for w in WAYS if w in {"off", "on", *a.ways.split(",")}]
    if unknown := set(a.ways.split(",")) - set(WAYS):
        ap.error(f"unknown --ways {sorted(unknown)}: choose from {', '.join(WAYS)}")

    with tempfile.TemporaryDirectory() as tmp:
        path = synth_model(Path(tmp) / "mini", "mini", layers=a.layers)
        tokenizer = ModelDir.load(path).tokenizer
        _, bodies = mixed_bodies(tokenizer, a.states, a.state_tokens, a.warm + a.requests, a.zipf)
        encoded = [json.dumps(b).encode() for b in bodies]
        warm, raw = encoded[: a.warm], encoded[a.warm :]
        seen = {b["state"] for b in bodies[: a.warm]}
        asked = {b["state"] for b in bodies[a.warm :]}
        rows: dict[str, dict] = {}
        answers: dict[str, list[bytes]] = {}
        load = [os.getloadavg()]
        for rep in range(a.reps):
            for way in ways:
                run = run_once(path, Path(tmp) / f"{way}{rep}", way, raw, a.clients, warm)
                load.append(os.getloadavg())
                if answers.setdefault(way, run["answers"]) != run["answers"]:
                    raise SystemExit(f"two runs with the caches {way} answered differently: a bug")
                runs = [*rows.get(way, {}).get("runs_s", []), run["wall"]]
                if way not in rows or run["wall"] < rows[way]["seconds"]:
                    rows[way] = {"decisions_per_s": a.requests / run["wall"], "seconds": run["wall"]}
                    rows[way].update({k: run[k] for k in ("answer_cache", "state_cache", "cached_tokens")})
                rows[way]["runs_s"] = runs
    same = {w: sum(x == y for x, y in zip(answers["off"], answers[w], strict=True)) for w in ways}
    on = rows["on"]
    hits = on["answer_cache"].get("hit", 0)
    sc = on["state_cache"]
    looked = sc["hits"] + sc["partial_hits"] + sc["misses"]
    result = {
        "machine": report.machine(),
        "load_average": load,
        "args": vars(a),
        "distinct_states_asked": len(asked),
        "states_new_to_timed_run": len(asked - seen),
        "rows": rows,
        "throughput_ratio": on["decisions_per_s"] / rows["off"]["decisions_per_s"],
        "answer_cache_hit_share": hits / a.requests,
        "state_cache_hit_rate": (sc["hits"] + sc["partial_hits"]) / looked if looked else 0.0,
        "identical_answers": {w: f"{n}/{a.requests}" for w, n in same.items()},
    }
    report.write_json(a.out, result)
    after = f" after {a.warm} untimed ({len(asked - seen)} of them new)" if a.warm else ""
    print(
        f"\n`basal serve`, mini shapes cut to {a.layers} layer(s), f32, torch CPU; {a.requests} requests from "
        f"{a.clients} HTTP clients over {a.states} states (Zipf {a.zipf}: {len(asked)} distinct asked{after}), "
        f"~{a.state_tokens}-token states; load average {' → '.join(f'{x[0]:.1f}' for x in load)}\n"
        f"caches off {rows['off']['decisions_per_s']:.1f} decisions/s, on {on['decisions_per_s']:.1f}: "
        f"{result['throughput_ratio']:.2f}×; answer cache hits {hits}/{a.requests} "
        f"({result['answer_cache_hit_share']:.0%}); the state cache on the rest: {sc['hits']:.0f} hits, "
        f"{sc['partial_hits']:.0f} partial, {sc['misses']:.0f} misses ({result['state_cache_hit_rate']:.0%}), "
        f"{on['cached_tokens']:,} tokens read from it; answers byte-equal but timings {same['on']}/{a.requests}"
    )
    if len(ways) > 2:
        print("\n| caches | decisions/s | vs off | answer cache hits | state cache hits / looked up | equal to off |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for w in ways:
            r, c = rows[w], rows[w]["state_cache"]
            print(
                f"| {w} | {r['decisions_per_s']:.1f} | {r['decisions_per_s'] / rows['off']['decisions_per_s']:.2f}× | "
                f"{r['answer_cache'].get('hit', 0)} | {c['hits'] + c['partial_hits']:.0f} / "
                f"{c['hits'] + c['partial_hits'] + c['misses']:.0f} | {same[w]}/{a.requests} |"
            )
    return result


if __name__ == "__main__":
    main()
