"""The Batch API's store: lines per second on one and two servers sharing PostgreSQL vs one server on SQLite, and
the store's own time per line.

    python -m bench.compare.batch_store                       # 2000 lines (200 states x 10 questions), the demo model
    python -m bench.compare.batch_store --lines 4000 --rounds 3

Needs Debian's PostgreSQL binaries (a server of its own is started in a temporary directory, as in the tests,
but with fsync on, so that its commits reach the disk as SQLite's do) and the postgres extra. In one run,
`--rounds` times in turn:
1. servers: `basal serve` children on the demo model — one on SQLite, one on PostgreSQL, two on one PostgreSQL
   database and one shared files directory; the same batch created on the first, timed from create to
   `completed` (polled every 50 ms): lines/s. The servers start before the clock does.
2. the store's own cost per line, without the engine: the calls one server makes for a batch (start, a claim
   per chunk, its records in pieces of 64, the last piece marking the chunk done, finalize) replayed alone,
   against the line's wall time on one server (1 / its lines per second) — the issue's goal is under 5 %;
3. the same calls timed inside one in-process server during a batch (every store call of the runner and the
   API's polls): wall time (worker threads beside the engine on a shared machine wait for the GIL and the
   cores, so an upper bound) and this process's CPU time in them.
Numbers are ratios within one run; the machine's load is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from basal_client import BasalClient

from basal.batch.service import CHUNK_LINES, BatchService, BatchSettings
from basal.batch.store import open_store
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from bench.lab.http_speed import healthy
from tests.ports import free_port
from tests.postgres import Postgres, binaries
from tests.servers import live_server, make_engines


def lines_of(n: int, per_state: int) -> list[dict]:
    return [
        {
            "custom_id": f"s{i // per_state}-q{i % per_state}",
            "body": {
                "state": f"Ticket {i // per_state}: the parcel arrived damaged and the refund is late.",
                "questions": {f"q{i % per_state}": {"type": "noul", "instructions": f"Is point {i % per_state} new?"}},
            },
        }
        for i in range(n)
    ]


def start(model: Path, root: Path, database: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = root.parent / f"serve-{port}.yml"
    config.write_text(
        f"addr: 127.0.0.1:{port}\nmodels:\n  - path: {model}\nbatches:\n  dir: {root}\n"
        + (f"  database: {database}\n" if database else "")
    )
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([sys.executable, "-m", "basal", "serve", "--config", str(config)],
                            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    return proc, healthy(proc, f"http://127.0.0.1:{port}", 180)


def timed_batch(url: str, lines: list[dict]) -> float:
    with BasalClient(url, timeout=600) as client:
        file = client.files.create(
            b"".join(json.dumps({**r, "method": "POST", "url": "/v1/basal"}).encode() + b"\n" for r in lines)
        )
        started = time.perf_counter()
        batch = client.batches.create(input_file_id=file["id"])
        done = client.batches.wait(batch["id"], timeout=3600, poll_interval=0.05)
        seconds = time.perf_counter() - started
    assert done["status"] == "completed" and done["request_counts"]["completed"] == len(lines), done
    return seconds


def servers(model: Path, lines: list[dict], kind: str, count: int, pg: Postgres, tmp: Path) -> float:
    """Lines/s of one batch on `count` servers of one store."""
    root = tmp / f"store-{kind}-{count}-{time.monotonic_ns()}"
    database = pg.new_database() if kind == "postgresql" else None
    started = [start(model, root, database, tmp / "serve.log") for _ in range(count)]
    try:
        with httpx.Client(base_url=started[0][1], timeout=600) as client:  # warm-up: the first pass's compile
            client.post("/v1/basal", json=lines[0]["body"])
        return len(lines) / timed_batch(started[0][1], lines)
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            proc.wait(60)


class Timed:
    """A store whose every method call adds its wall time to `seconds[name]` (thread-safe)."""

    def __init__(self, inner: Any):
        self._inner, self._lock = inner, threading.Lock()
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu_seconds: dict[str, float] = defaultdict(float)  # this process's CPU in them (no GIL or I/O wait)
        self.calls: dict[str, int] = defaultdict(int)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or name in ("file_path", "upload_path", "now", "close"):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return value(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[name] += time.perf_counter() - started
                    self.cpu_seconds[name] += time.thread_time() - cpu
                    self.calls[name] += 1

        return timed


def replay(n: int, database: str | None, tmp: Path) -> float:
    """Seconds per line of the store's calls for an n-line batch on one server, with no engine."""
    root = tmp / f"replay-{time.monotonic_ns()}"
    store = open_store(root, database)
    try:
        upload = store.upload_path()
        upload.write_bytes(b"x\n" * n)
        file = store.add_file(upload, "in.jsonl", "batch", None, n)
        record = b'{"id":"batch_req_0","custom_id":"c","response":{"status_code":200,"body":{}},"error":null}'
        started = time.perf_counter()
        batch, _ = store.create_batch(file["id"], "/v1/basal", 86400, "24h", None, None, None, 8)
        numbers = list(range(1, n + 1))
        store.start(batch["id"], n, [numbers[i : i + CHUNK_LINES] for i in range(0, n, CHUNK_LINES)])
        while (got := store.claim(batch["id"], "bench", 30)) is not None:
            chunk, todo = got
            for i in range(0, len(todo), 64):  # the runner's writer records what finished since its last write
                last = i + 64 >= len(todo)
                store.add_results(batch["id"], [(line, True, record) for line in todo[i : i + 64]], (chunk,) * last)
        store.set_status(batch["id"], "finalizing", ("in_progress",))
        assert store.finalize(batch["id"], "completed", None)
        return (time.perf_counter() - started) / n
    finally:
        store.close()


def overhead(model: ModelDir, lines: list[dict], database: str | None, tmp: Path) -> dict:
    root = tmp / f"inproc-{time.monotonic_ns()}"
    store = Timed(open_store(root, database))
    service = BatchService(store, BatchSettings(root=root, database=database))  # type: ignore[arg-type]
    with live_server(make_engines(model), batches=service) as url:
        httpx.post(f"{url}/v1/basal", json=lines[0]["body"], timeout=600)
        store.seconds.clear()
        store.cpu_seconds.clear()
        store.calls.clear()
        wall = timed_batch(url, lines)
    spent = sum(store.seconds.values())
    return {
        "store": "postgresql" if database else "sqlite",
        "lines_per_s": len(lines) / wall,
        "line_ms": wall / len(lines) * 1000,
        "store_us_per_line": spent / len(lines) * 1e6,
        "store_share": spent / wall,
        "store_cpu_us_per_line": sum(store.cpu_seconds.values()) / len(lines) * 1e6,
        "calls": dict(store.calls),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--per-state", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/results/batch_store.json")
    a = ap.parse_args()
    bindir = binaries()
    if bindir is None:
        raise SystemExit("needs PostgreSQL's server binaries: apt-get install postgresql")
    lines = lines_of(a.lines, a.per_state)
    tmp = Path(tempfile.mkdtemp(prefix="basal-bench-store-"))
    pg = Postgres(bindir, durable=True)  # fsync on: commits reach the disk, as SQLite's (synchronous=FULL)
    pg.start()
    try:
        model_dir = synth_model(tmp / "demo", "demo")
        model = ModelDir.load(model_dir)
        rates: dict[str, list[float]] = defaultdict(list)
        costs: list[dict] = []
        for _ in range(a.rounds):
            for kind, count in (("sqlite", 1), ("postgresql", 1), ("postgresql", 2)):
                rates[f"{kind} x{count}"].append(servers(model_dir, lines, kind, count, pg, tmp))
                print(f"{kind} x{count}: {rates[f'{kind} x{count}'][-1]:.0f} lines/s", flush=True)
            for database in (None, pg.new_database()):
                costs.append(overhead(model, lines, database, tmp))
                again = None if database is None else pg.new_database()  # a store of its own (its own files)
                costs[-1]["replay_us_per_line"] = replay(len(lines), again, tmp) * 1e6
                print(json.dumps(costs[-1]), flush=True)
    finally:
        pg.stop("immediate")
        pg.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    base = median["sqlite x1"]
    stores = ("sqlite", "postgresql")
    summary = {
        "lines": a.lines,
        "lines_per_s": median,
        "vs_sqlite": {k: v / base for k, v in median.items()},
        "store_alone_us_per_line": {
            s: statistics.median(c["replay_us_per_line"] for c in costs if c["store"] == s) for s in stores
        },
        "store_in_server_us_per_line": {
            s: statistics.median(c["store_us_per_line"] for c in costs if c["store"] == s) for s in stores
        },
        "store_in_server_cpu_us_per_line": {
            s: statistics.median(c["store_cpu_us_per_line"] for c in costs if c["store"] == s) for s in stores
        },
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "rounds": {"rates": rates, "overhead": costs},
    }
    line_us = 1e6 / median["sqlite x1"]
    summary["store_alone_share_of_a_line"] = {s: v / line_us for s, v in summary["store_alone_us_per_line"].items()}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    keys = ("lines_per_s", "vs_sqlite", "store_alone_us_per_line", "store_alone_share_of_a_line",
            "store_in_server_us_per_line", "store_in_server_cpu_us_per_line")  # fmt: skip
    print(json.dumps({k: summary[k] for k in keys}))
    print(f"load average {os.getloadavg()}; written {out}")


if __name__ == "__main__":
    main()
