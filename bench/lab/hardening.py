"""Hardening benchmarks (issue 14): short requests while a long document runs, and goodput under a retry storm.

    python bench/lab/hardening.py short-behind-long --interval 1.5 --floor-compare   # mini cut to 4 layers, in-process
    python bench/lab/hardening.py retry-storm --before /tmp/old14 --rounds 3       # `basal serve` subprocesses

Prints one JSON line per measurement, then a summary line with ratios. On a shared machine compare ratios measured
in the same run, not absolute times.

short-behind-long: a long document (> 4096 packed tokens, so it takes the long lane) starts; short requests
(one noul question) arrive every `--interval` s while it runs. Reports short-request latency p50/p99 idle and
during the long pass, and the long lane's share of the device while shorts waited. A short request can only pass
the long one where the long lane checks in (its pause points). `--floor-compare` runs the same measurement with the
long lane's floor (`--long-share`, default the gate's) and without it (0), alternating for `--rounds`. The stream
of shorts stops after `--max-stream-s`; a long request still running then is cancelled (its pass stops at the next
pause point), so a run without the floor ends even where short requests alone fill the device. Without
`--floor-compare` and `--long-share` it imports only what older checkouts have (run it with PYTHONPATH=<checkout>).

retry-storm: `max_inflight` 8 and 64 clients that resend at once on a 529 (ignoring Retry-After); each request
asks two questions on a 1.3 KB state and carries 60 KB of client metadata (a 70 KB body); goodput = answered
requests per second, with 8 clients (calm) and with 64 (storm). `--before DIR` runs the server from another
checkout as well (PYTHONPATH=DIR for the server process): each round measures both, in alternating order, and the
summary is the median of the per-round ratios after/before, so a burst of load on a shared machine moves one round,
not the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


# ---------------------------------------------------------------------------------------------------------------
# short requests behind a long document


def short_behind_long(
    layers: int,
    long_words: int,
    shorts_idle: int,
    interval_s: float = 0.25,
    long_share: float | None = None,
    max_stream_s: float = 600.0,
) -> dict:
    from basal.backends.cuda.backend import TorchBackend
    from basal.core.engine.engine import Engine, EngineSettings
    from basal.core.engine.engines import Engines
    from basal.core.engine.gate import Gate
    from basal.core.engine.metrics import Metrics
    from basal.core.engine.pipeline import Pipeline
    from basal.core.model.model_dir import ModelDir
    from basal.core.model.synth import synth_model
    from basal.core.request.dialects import parse_systemone

    home = Path(os.environ.get("BASAL_HOME", Path.home() / ".cache" / "basal")) / f"bench-mini-{layers}l"
    if not (home / "config.json").exists():
        synth_model(home, "mini", layers=layers, seed=0)
    model = ModelDir.load(home)
    metrics = Metrics()
    gate = Gate(100.0) if long_share is None else Gate(100.0, long_share)  # older checkouts: no floor argument
    engine = Engine(model.name, Pipeline(model, TorchBackend.load(model)), gate, metrics, EngineSettings())
    engines = Engines({model.name: engine}, model.name, metrics)
    engines.start()

    def body(state: str, tag: str) -> dict:
        return {"model": model.name, "state": state, "questions": {tag: {"type": "noul", "instructions": "Urgent?"}}}

    words = "order arrived damaged please refund the payment today "
    long_req = parse_systemone(body(words * long_words, "long"), lambda m: m)
    long_cost = engine.admit(long_req, print, lambda: False).cost

    async def one(tag: str) -> float:
        t = time.perf_counter()
        await engines.run(parse_systemone(body(f"ticket {tag}: late delivery", tag), lambda m: m))
        return time.perf_counter() - t

    async def main() -> tuple[list[float], list[float], float, bool]:
        await one("warm")
        idle = [await one(f"idle{i}") for i in range(shorts_idle)]
        gone = threading.Event()
        t0 = time.perf_counter()
        long_task = asyncio.create_task(engines.run(long_req, gone.is_set))
        tasks, i = [], 0
        await asyncio.sleep(0.5)
        while not long_task.done() and time.perf_counter() - t0 < max_stream_s:
            tasks.append(asyncio.create_task(one(f"during{i}")))
            i += 1
            await asyncio.sleep(interval_s)
        finished = long_task.done()
        long_s = time.perf_counter() - t0
        during = list(await asyncio.gather(*tasks))
        gone.set()  # the stream is over: a long request still running is cancelled at its next pause point
        with contextlib.suppress(Exception):
            await long_task
        return idle, during, long_s, finished

    idle, during, long_s, finished = asyncio.run(main())
    engines.close()
    result = {
        "bench": "short-behind-long",
        "layers": layers,
        "interval_s": interval_s,
        "long_packed_tokens": long_cost,
        "long_finished": finished,  # False: still running when the stream stopped after max_stream_s
        "long_s": round(long_s, 2),
        "idle_p50_s": round(percentile(idle, 0.5), 3),
        "idle_p99_s": round(percentile(idle, 0.99), 3),
        "during_n": len(during),
        "during_p50_s": round(percentile(during, 0.5), 3),
        "during_p99_s": round(percentile(during, 0.99), 3),
        "preemptions": gate.preemptions,
    }
    if long_share is not None:
        result |= {
            "long_share": long_share,
            "long_share_seen": round(gate.long_share_seen(), 3),  # device time of the long lane while shorts waited
            "floor_turns": gate.floor_turns,
        }
    return result


def floor_compare(args: argparse.Namespace, share: float) -> dict:
    """short-behind-long with the floor and without it, alternating; ratios with/without per round, then medians."""
    runs: dict[float, list[dict]] = {share: [], 0.0: []}
    for r in range(args.rounds):
        for s in (share, 0.0) if r % 2 == 0 else (0.0, share):
            result = short_behind_long(
                args.layers, args.long_words, args.shorts_idle, args.interval, s, args.max_stream_s
            )
            print(json.dumps(result), flush=True)
            runs[s].append(result)

    def ratio(key: str) -> float:
        return statistics.median(w[key] / max(o[key], 1e-9) for w, o in zip(runs[share], runs[0.0], strict=True))

    return {
        "bench": "short-behind-long-floor",
        "interval_s": args.interval,
        "long_share": share,
        "rounds": args.rounds,
        "long_finished_with_without": [
            sum(r["long_finished"] for r in runs[share]),
            sum(r["long_finished"] for r in runs[0.0]),
        ],
        "long_share_seen_with_without": [
            statistics.median(r["long_share_seen"] for r in runs[share]),
            statistics.median(r["long_share_seen"] for r in runs[0.0]),
        ],
        "during_p50_ratio": round(ratio("during_p50_s"), 3),
        "during_p99_ratio": round(ratio("during_p99_s"), 3),
        "long_s_ratio": round(ratio("long_s"), 3),
        "goal_p99_s": [round(2 * r["idle_p99_s"] + 0.1, 3) for r in runs[share]],  # 2x idle p99 + one slice
        "during_p99_with_s": [r["during_p99_s"] for r in runs[share]],
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


def retry_storm(clients: int, seconds: float, max_inflight: int, checkout: str | None = None) -> dict:
    """One calm and one storm measurement against a fresh server (from `checkout` when given)."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if checkout:
        env["PYTHONPATH"] = str(Path(checkout).resolve())
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
        "checkout": checkout or "this",
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


def storm_rounds(args: argparse.Namespace) -> dict:
    """Retry storm against this checkout and `--before`, alternating which goes first, `--rounds` times."""
    after_dir = str(Path(__file__).resolve().parents[2])
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = (("before", args.before), ("after", after_dir))
        for name, checkout in order if r % 2 == 0 else order[::-1]:
            result = retry_storm(args.clients, args.seconds, args.max_inflight, checkout) | {"code": name, "round": r}
            print(json.dumps(result), flush=True)
            runs[name].append(result)

    def per_round(key: str) -> list[float]:
        return [a[key] / max(b[key], 1e-9) for a, b in zip(runs["after"], runs["before"], strict=True)]

    def cpu_per_response(run: dict) -> float:
        return run["storm_server_cpu_s"] / max(
            1.0, run["storm_goodput_rps"] * run["seconds"] + run["storm_529_rps"] * run["seconds"]
        )

    return {
        "bench": "retry-storm-rounds",
        "rounds": args.rounds,
        "goodput_kept_before": [r["goodput_kept"] for r in runs["before"]],
        "goodput_kept_after": [r["goodput_kept"] for r in runs["after"]],
        "storm_goodput_ratio_median": round(statistics.median(per_round("storm_goodput_rps")), 3),
        "goodput_kept_ratio_median": round(statistics.median(per_round("goodput_kept")), 3),
        "server_cpu_ms_per_response_before_after": [
            round(1000 * statistics.median(map(cpu_per_response, runs[k])), 3) for k in ("before", "after")
        ],
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
    p.add_argument("--long-share", type=float, default=None, help="the long lane's floor (default: the gate's)")
    p.add_argument("--floor-compare", action="store_true", help="with the floor and without it (0), alternating")
    p.add_argument("--max-stream-s", type=float, default=600.0, help="stop the short requests after this long")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds (--floor-compare, --before)")
    p.add_argument("--before", default=None, help="retry-storm: also serve from this checkout, alternating")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--max-inflight", type=int, default=8)
    a = p.parse_args()
    print("command: python " + " ".join(sys.argv), flush=True)
    if a.bench == "short-behind-long" and a.floor_compare:
        from basal.core.engine.gate import DEFAULT_LONG_SHARE

        print(json.dumps(floor_compare(a, DEFAULT_LONG_SHARE if a.long_share is None else a.long_share)))
    elif a.bench == "short-behind-long":
        args = (a.layers, a.long_words, a.shorts_idle, a.interval, a.long_share, a.max_stream_s)
        print(json.dumps(short_behind_long(*args)))
    elif a.before:
        print(json.dumps(storm_rounds(a)))
    else:
        print(json.dumps(retry_storm(a.clients, a.seconds, a.max_inflight)))


if __name__ == "__main__":
    main()
