"""One question over HTTP at 1, 8 and 32 concurrent clients, against the same engine called in-process.

    python -m bench.http_speed                         # demo model, then mini shapes cut to 4 layers
    python -m bench.http_speed --models demo --requests 100

The server is `basal serve` in its own process (loopback); clients are threads with keep-alive connections.
The in-process run calls `Engines.run` from asyncio tasks in this process: the difference at 1 client is what
HTTP (JSON, headers, uvicorn, loopback) adds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from basal.core.contract import parse_systemone
from basal.core.model_dir import ModelDir
from basal.core.synth import synth_model
from bench.workloads import questions, state_of_tokens
from tests.servers import free_port, make_engines


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p90_ms": percentile(latencies, 90) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000,
    }


def over_http(url: str, body: dict, clients: int, per_client: int) -> dict[str, float]:
    def client(_: int) -> list[float]:
        out = []
        with httpx.Client(base_url=url, timeout=600) as c:
            for _ in range(per_client):
                t = time.perf_counter()
                r = c.post("/v1/systemone", json=body)
                out.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        lat = [x for part in pool.map(client, range(clients)) for x in part]
    return summary(lat, time.perf_counter() - t0)


def in_process(engines, body: dict, clients: int, per_client: int) -> dict[str, float]:
    plan = parse_systemone(body, lambda m: next(iter(engines.engines)))

    async def client() -> list[float]:
        out = []
        for _ in range(per_client):
            t = time.perf_counter()
            await engines.run(plan)
            out.append(time.perf_counter() - t)
        return out

    async def main():
        t0 = time.perf_counter()
        parts = await asyncio.gather(*(client() for _ in range(clients)))
        return [x for p in parts for x in p], time.perf_counter() - t0

    lat, wall = asyncio.run(main())
    return summary(lat, wall)


def start_server(model_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "basal", "serve", "--model", str(model_dir), "--addr", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,mini4", help="comma list of demo, mini4 or model directories")
    ap.add_argument("--requests", type=int, default=64, help="requests per concurrency level (demo)")
    ap.add_argument("--out", default="bench/results/http_speed.json")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            if name == "demo":
                path, n = synth_model(Path(tmp) / "demo", "demo"), a.requests
            elif name == "mini4":
                path, n = synth_model(Path(tmp) / "mini4", "mini", layers=4), max(8, a.requests // 8)
            else:
                path, n = Path(name), a.requests
            model = ModelDir.load(path)
            body = {
                "model": model.name,
                "state": state_of_tokens(model.tokenizer, 100, "en", 0),
                "questions": questions(1, "en", 1),
            }
            engines = make_engines(model)
            engines.start()
            proc, url = start_server(path)
            try:
                over_http(url, body, 1, 3)  # warm-up
                in_process(engines, body, 1, 3)
                for clients in (1, 8, 32):
                    per = max(1, n // clients)
                    h = over_http(url, body, clients, per)
                    p = in_process(engines, body, clients, per)
                    results.append({"model": name, "clients": clients, "http": h, "in_process": p})
                    print(
                        f"{name} {clients:>2} clients: HTTP {h['rps']:.1f} req/s p50 {h['p50_ms']:.1f} ms | "
                        f"in-process {p['rps']:.1f} req/s p50 {p['p50_ms']:.1f} ms",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(30)
                engines.close()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": results}, indent=2))
    print(
        "\n| model | clients | HTTP req/s | HTTP p50 / p90 / p99 ms | in-process req/s | in-process p50 / p90 / p99 ms "
        "| HTTP p50 added |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        h, p = r["http"], r["in_process"]
        print(
            f"| {r['model']} | {r['clients']} | {h['rps']:.1f} | {h['p50_ms']:.1f} / {h['p90_ms']:.1f} / "
            f"{h['p99_ms']:.1f} | {p['rps']:.1f} | {p['p50_ms']:.1f} / {p['p90_ms']:.1f} / {p['p99_ms']:.1f} | "
            f"{h['p50_ms'] - p['p50_ms']:+.1f} ms |"
        )


if __name__ == "__main__":
    main()
