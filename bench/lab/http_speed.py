"""One question over HTTP at 1, 8 and 32 concurrent clients, against the same engine called in-process.

    python -m bench.lab.http_speed                         # demo model, then mini shapes cut to 4 layers
    python -m bench.lab.http_speed --models demo --requests 100
    python -m bench.lab.http_speed --models demo --no-mix     # the concurrency levels only; ends with p50 at 32 clients

The server is `basal serve` in its own process (loopback); clients are threads, each with one keep-alive
connection speaking minimal HTTP/1.1 over a socket (like wrk: a Python HTTP library would add more client time
than the server spends on HTTP).
The in-process run calls `Engines.run` from asyncio tasks in this process. Both sides report the time each
request spent outside its batch (total minus the engine's queue + compute time, from the `x-basal-*` headers
over HTTP); their difference is what HTTP (socket, uvicorn, JSON, contract) adds per request, free of the
run-to-run noise of the forward pass itself on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from basal.benchsuite.report import pct
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from basal.core.request.dialects import parse_systemone
from bench.compare.tree_speed import MIX
from tests.ports import free_port
from tests.servers import make_engines


def summary(latencies: list[float], wall: float, outside: list[float]) -> dict[str, float]:
    """`outside`: each request's time outside its batch (total - x-basal-queue-ms - x-basal-compute-ms)."""
    return {
        "outside_p50_ms": pct(outside, 50) * 1000,
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        "p50_ms": pct(latencies, 50) * 1000,
        "p90_ms": pct(latencies, 90) * 1000,
        "p99_ms": pct(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000,
    }


class RawClient:
    """One keep-alive HTTP/1.1 connection: send a prepared POST, read status, headers and body."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        head = f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        self.sock.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        raw_head, rest = data.split(b"\r\n\r\n", 1)
        lines = raw_head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        while len(rest) < int(headers["content-length"]):
            rest += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, rest

    def close(self) -> None:
        self.sock.close()


def over_http(url: str, body: dict, clients: int, per_client: int) -> dict[str, float]:
    payload = json.dumps(body).encode()

    def client(_: int) -> list[tuple[float, float, float]]:
        out = []
        c = RawClient(url)
        for _ in range(per_client):
            t = time.perf_counter()
            status, headers, content = c.post("/v1/systemone", payload)
            took = time.perf_counter() - t
            assert status == 200, content
            engine_s = (float(headers["x-basal-queue-ms"]) + float(headers["x-basal-compute-ms"])) / 1000
            out.append((took, took - engine_s, float(headers["x-basal-total-ms"])))
        c.close()
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        rows = [x for part in pool.map(client, range(clients)) for x in part]
    result = summary([r[0] for r in rows], time.perf_counter() - t0, [r[1] for r in rows])
    server = [r[2] for r in rows]  # the server's own time per request (x-basal-total-ms), without the client's
    return result | {
        "server_p50_ms": pct(server, 50),
        "server_p99_ms": pct(server, 99),
        "server_max_ms": max(server),
    }


def in_process(engines, body: dict, clients: int, per_client: int) -> dict[str, float]:
    plan = parse_systemone(body, lambda m: next(iter(engines.engines)))

    async def client() -> list[tuple[float, float]]:
        out = []
        for _ in range(per_client):
            t = time.perf_counter()
            result = await engines.run(plan)
            took = time.perf_counter() - t
            out.append((took, took - (result.queue_ms + result.compute_ms) / 1000))
        return out

    async def main():
        t0 = time.perf_counter()
        parts = await asyncio.gather(*(client() for _ in range(clients)))
        return [x for p in parts for x in p], time.perf_counter() - t0

    rows, wall = asyncio.run(main())
    return summary([r[0] for r in rows], wall, [r[1] for r in rows])


def start_server(model_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "basal", "serve", "--model", str(model_dir), "--addr", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    return proc, healthy(proc, url)


def metric_total(text: str, name: str, where: Callable[[dict[str, str]], bool] = lambda labels: True) -> float:
    """A sample of a server's /metrics text summed over its label sets (those `where` admits); 0 where it has none."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and where(sample.labels)
    )


def healthy(proc: subprocess.Popen, url: str, timeout_s: float = 60.0) -> str:
    """`url` once the server child answers /health; kills it and raises if it exits or does not answer in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the server did not start (exit code {proc.poll()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,mini4", help="comma list of demo, mini4 or model directories")
    ap.add_argument("--requests", type=int, default=64, help="requests per concurrency level (demo)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrency levels")
    ap.add_argument("--no-mix", action="store_true", help="skip the one-at-a-time request mix")
    ap.add_argument("--out", default="bench/results/http_speed.json")
    a = ap.parse_args()
    results, mix_rows = [], []
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
                # the request mix of bench/compare/tree_speed.py, one at a time
                for label, n_q, state_tokens in [] if a.no_mix else MIX:
                    mixed = {
                        "model": model.name,
                        "state": state_of_tokens(model.tokenizer, state_tokens, "pl", 2),
                        "questions": questions(n_q, "pl", 2),
                    }
                    reps = 3 if name != "demo" else 10
                    h, p = over_http(url, mixed, 1, reps), in_process(engines, mixed, 1, reps)
                    mix_rows.append({"model": name, "request": label, "http": h, "in_process": p})
                    print(
                        f"{name} {label}: HTTP p50 {h['p50_ms']:.1f} ms | in-process p50 {p['p50_ms']:.1f} ms",
                        flush=True,
                    )
                for clients in a.clients:
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
    Path(a.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": results, "mix": mix_rows}, indent=2))
    print("\n| model | request | HTTP p50 ms | in-process p50 ms | outside the engine, p50: HTTP / in-process |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in mix_rows:
        h, p = r["http"], r["in_process"]
        print(
            f"| {r['model']} | {r['request']} | {h['p50_ms']:.1f} | {p['p50_ms']:.1f} | "
            f"{h['outside_p50_ms']:.2f} / {p['outside_p50_ms']:.2f} ms |"
        )
    print(
        "\n| model | clients | HTTP req/s | HTTP p50 / p90 / p99 ms | in-process req/s | in-process p50 / p90 / p99 ms "
        "| outside the engine, p50: HTTP / in-process | HTTP added |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        h, p = r["http"], r["in_process"]
        print(
            f"| {r['model']} | {r['clients']} | {h['rps']:.1f} | {h['p50_ms']:.1f} / {h['p90_ms']:.1f} / "
            f"{h['p99_ms']:.1f} | {p['rps']:.1f} | {p['p50_ms']:.1f} / {p['p90_ms']:.1f} / {p['p99_ms']:.1f} | "
            f"{h['outside_p50_ms']:.2f} / {p['outside_p50_ms']:.2f} ms | "
            f"{h['outside_p50_ms'] - p['outside_p50_ms']:+.2f} ms |"
        )
    for r in results:
        if r["clients"] == max(x["clients"] for x in results if x["model"] == r["model"]):
            h, p = r["http"], r["in_process"]
            print(
                f"\n{r['model']}, {r['clients']} clients: p50 HTTP {h['p50_ms']:.1f} ms / in-process engine "
                f"{p['p50_ms']:.1f} ms = {h['p50_ms'] / p['p50_ms']:.2f}x (+{h['p50_ms'] - p['p50_ms']:.1f} ms)"
            )


if __name__ == "__main__":
    main()
