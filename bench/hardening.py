"""Hardening benchmarks (issue 14): short requests while a long document runs, and goodput under a retry storm.

    python bench/hardening.py short-behind-long      # mini shapes cut to 4 layers, in-process engine
    python bench/hardening.py retry-storm            # `basal serve` (demo model) in a subprocess, 64 clients

Run it once with this checkout on PYTHONPATH and once with another (the code before a change) to compare; it
imports only what both have. Prints one JSON line per measurement. On a shared machine compare ratios measured
in the same session, not absolute times.

short-behind-long: a long document (> 4096 packed tokens, so it takes the long lane) starts; short requests
(one noul question) arrive every 0.25 s while it runs. Reports short-request latency p50/p99 idle and during
the long pass. A short request can only pass the long one where the long lane checks in (between layers; inside
a layer only where the backend yields there).

retry-storm: `max_inflight` 8 and 64 clients that resend at once on a 529 (ignoring Retry-After); each request
asks two questions on a 1.3 KB state and carries 60 KB of client metadata (a 70 KB body); goodput = answered
requests per second, with 8 clients (calm) and with 64 (storm).
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
from pathlib import Path


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


# ---------------------------------------------------------------------------------------------------------------
# short requests behind a long document


def short_behind_long(layers: int, long_words: int, shorts_idle: int, interval_s: float = 0.25) -> dict:
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.contract import parse_systemone
    from basal.core.engine import Engine, Engines, EngineSettings
    from basal.core.gate import Gate
    from basal.core.metrics import Metrics
    from basal.core.model_dir import ModelDir
    from basal.core.pipeline import Pipeline
    from basal.core.synth import synth_model

    home = Path(os.environ.get("BASAL_HOME", Path.home() / ".cache" / "basal")) / f"bench-mini-{layers}l"
    if not (home / "config.json").exists():
        synth_model(home, "mini", layers=layers, seed=0)
    model = ModelDir.load(home)
    metrics, gate = Metrics(), Gate(100.0)
    engine = Engine(model.name, Pipeline(model, TorchBackend.load(model)), gate, metrics, EngineSettings())
    engines = Engines({model.name: engine}, model.name, metrics)
    engines.start()

    def body(state: str, tag: str) -> dict:
        return {"model": model.name, "state": state, "questions": {tag: {"type": "noul", "instructions": "Urgent?"}}}

    words = "order arrived damaged please refund the payment today "
    long_req = parse_systemone(body(words * long_words, "long"), lambda m: m)
    long_cost = engine.plan(long_req, print, lambda: False).cost

    async def one(tag: str) -> float:
        t = time.perf_counter()
        await engines.run(parse_systemone(body(f"ticket {tag}: late delivery", tag), lambda m: m))
        return time.perf_counter() - t

    async def main() -> tuple[list[float], list[float], float]:
        await one("warm")
        idle = [await one(f"idle{i}") for i in range(shorts_idle)]
        t0 = time.perf_counter()
        long_task = asyncio.create_task(engines.run(long_req))
        during, tasks, i = [], [], 0
        await asyncio.sleep(0.5)
        while not long_task.done():
            tasks.append(asyncio.create_task(one(f"during{i}")))
            i += 1
            await asyncio.sleep(interval_s)
        long_s = time.perf_counter() - t0
        during = list(await asyncio.gather(*tasks))
        return idle, during, long_s

    idle, during, long_s = asyncio.run(main())
    engines.close()
    return {
        "bench": "short-behind-long",
        "layers": layers,
        "interval_s": interval_s,
        "long_packed_tokens": long_cost,
        "long_s": round(long_s, 2),
        "idle_p50_s": round(percentile(idle, 0.5), 3),
        "idle_p99_s": round(percentile(idle, 0.99), 3),
        "during_n": len(during),
        "during_p50_s": round(percentile(during, 0.5), 3),
        "during_p99_s": round(percentile(during, 0.99), 3),
        "preemptions": gate.preemptions,
    }


# ---------------------------------------------------------------------------------------------------------------
# retry storm against `basal serve`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def storm_body() -> bytes:
    """Cheap to compute (two questions on a short state), costly to read: 60 KB of client metadata ride along."""
    state = "Customer wrote: the parcel arrived late and the box was damaged, " * 20
    questions = {f"q{i}": {"type": "noul", "instructions": f"Question {i}: is this about delivery?"} for i in range(2)}
    metadata = {"history": [{"ticket": i, "text": "previous message about an earlier order " * 4} for i in range(350)]}
    return json.dumps({"model": "jev-latest", "state": state, "questions": questions, "metadata": metadata}).encode()


async def storm_client(port: int, body: bytes, until: float, counts: dict) -> None:
    request = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    reader = writer = None
    while time.perf_counter() < until:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=60)
            status = int(head.split()[1])
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            counts[status] = counts.get(status, 0) + 1
            if b"connection: close" in head.lower():
                writer.close()
                reader = writer = None
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            counts["reset"] = counts.get("reset", 0) + 1
            reader = writer = None


def retry_storm(clients: int, seconds: float, max_inflight: int) -> dict:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tempfile.TemporaryFile()  # noqa: SIM115  (closed with the process, below)
    server = subprocess.Popen(
        [sys.executable, "-m", "basal", "serve", "--addr", f"127.0.0.1:{port}", "--max-inflight", str(max_inflight)],
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if s.recv(100).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("server did not start")
            time.sleep(0.2)
        body = storm_body()

        async def run(n: int, duration: float) -> dict:
            counts: dict = {}
            until = time.perf_counter() + duration
            await asyncio.gather(*(storm_client(port, body, until, counts) for _ in range(n)))
            return counts

        asyncio.run(run(2, 3.0))  # warm up
        calm = asyncio.run(run(max_inflight, seconds))
        server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
        storm = asyncio.run(run(clients, seconds))
        server_cpu, client_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - client_cpu
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    return {
        "bench": "retry-storm",
        "body_bytes": len(body),
        "max_inflight": max_inflight,
        "seconds": seconds,
        "calm_clients": max_inflight,
        "calm_goodput_rps": round(calm.get(200, 0) / seconds, 2),
        "storm_clients": clients,
        "storm_goodput_rps": round(storm.get(200, 0) / seconds, 2),
        "storm_529_rps": round(storm.get(529, 0) / seconds, 1),
        "storm_other": {str(k): v for k, v in storm.items() if k not in (200, 529)},
        "goodput_kept": round(storm.get(200, 0) / max(1, calm.get(200, 0)), 3),
        "storm_server_cpu_s": round(server_cpu, 2),
        "storm_client_cpu_s": round(client_cpu, 2),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", choices=["short-behind-long", "retry-storm"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--long-words", type=int, default=260, help="state of the long document, in 8-word phrases")
    p.add_argument("--shorts-idle", type=int, default=20)
    p.add_argument(
        "--interval", type=float, default=0.25, help="seconds between short requests while the long one runs"
    )
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--max-inflight", type=int, default=8)
    a = p.parse_args()
    if a.bench == "short-behind-long":
        print(json.dumps(short_behind_long(a.layers, a.long_words, a.shorts_idle, a.interval)))
    else:
        print(json.dumps(retry_storm(a.clients, a.seconds, a.max_inflight)))


if __name__ == "__main__":
    main()
