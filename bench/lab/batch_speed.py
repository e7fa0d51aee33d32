"""Batch API throughput vs the same bodies sent one by one online, the prefix tree's saving across lines, and what a
running batch does to online latency.

    python -m bench.lab.batch_speed                                   # demo (2000 lines / 200 states), then mini cut
    python -m bench.lab.batch_speed --models demo --states 50

For each model a `basal serve` child (loopback, --metrics, its own batch store) gets, in this order:
1. a probe of short online requests, one after another, with nothing else running: p50 / p99;
2. every body of the batch sent one by one over HTTP (one keep-alive client): lines/s;
3. the same bodies as one batch through basal-client's `batches.create(requests=)` and `wait`: lines/s from create
   to the terminal status, and packed / prompt tokens of its passes (`basal_packed_tokens_total` /
   `basal_prompt_tokens_total`);
4. the same batch again with the probe running beside it: online p50 / p99 while a batch runs (and the batch's
   rate while online requests take the device first).
Each line is one question on a state; every state has `--per-state` questions (10), as the issue's workload.
Numbers are ratios within one run; the machine's load is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from basal_client import BasalClient

from basal.benchsuite.report import pct
from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from bench.lab.http_speed import healthy, metric_total
from tests.ports import free_port


def start(model_dir: Path, store: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = store.parent / f"serve-{port}.yml"
    config.write_text(
        f"addr: 127.0.0.1:{port}\nmetrics: true\nmodels:\n  - path: {model_dir}\nbatches:\n  dir: {store}\n"
    )
    proc = subprocess.Popen([sys.executable, "-m", "basal", "serve", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return proc, healthy(proc, f"http://127.0.0.1:{port}", 120)


def counter(url: str, name: str) -> float:
    """A counter of the server's, summed over its labels."""
    return metric_total(httpx.get(f"{url}/metrics").text, name)


def workload(model: ModelDir, states: int, per_state: int, state_tokens: int) -> list[dict]:
    lines = []
    for s in range(states):
        state = state_of_tokens(model.tokenizer, state_tokens, "en", s)
        qs = questions(per_state, "en", s)
        for i, (name, q) in enumerate(qs.items()):
            lines.append({"custom_id": f"s{s}-q{i}", "body": {"state": state, "questions": {name: q}}})
    return lines


def probe(url: str, body: dict, stop: threading.Event, out: list[float], limit: int | None = None) -> None:
    with httpx.Client(base_url=url, timeout=600) as client:
        while not stop.is_set() and (limit is None or len(out) < limit):
            started = time.perf_counter()
            assert client.post("/v1/basal", json=body).status_code == 200
            out.append(time.perf_counter() - started)


def run_batch(url: str, lines: list[dict], started_hook=lambda: None) -> tuple[float, dict]:
    """One batch of `lines` through basal-client, create to terminal status: -> (seconds, the batch)."""
    with BasalClient(url, timeout=600) as client:
        started = time.perf_counter()
        batch = client.batches.create(requests=lines)
        started_hook()
        done = client.batches.wait(batch["id"], timeout=3600, poll_interval=0.05)
        seconds = time.perf_counter() - started
    assert done["status"] == "completed" and done["request_counts"]["completed"] == len(lines), done
    return seconds, done


def run_model(name: str, path: Path, a: argparse.Namespace, tmp: Path) -> dict:
    model = ModelDir.load(path)
    states = a.states if name == "demo" else a.mini_states
    lines = workload(model, states, a.per_state, a.state_tokens)
    short = {"state": state_of_tokens(model.tokenizer, 16, "en", 999), "questions": questions(1, "en", 999)}
    proc, url = start(path, tmp / f"store-{name}")
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            for line in lines[: a.per_state]:  # warm-up
                client.post("/v1/basal", json=line["body"])
        idle: list[float] = []
        probe(url, short, threading.Event(), idle, limit=a.probes)

        single0 = counter(url, "basal_packed_tokens_total"), counter(url, "basal_prompt_tokens_total")
        started = time.perf_counter()
        with httpx.Client(base_url=url, timeout=600) as client:
            for line in lines:
                assert client.post("/v1/basal", json=line["body"]).status_code == 200
        one_by_one = len(lines) / (time.perf_counter() - started)
        single_packed = counter(url, "basal_packed_tokens_total") - single0[0]
        single_prompt = counter(url, "basal_prompt_tokens_total") - single0[1]

        packed0, prompt0 = counter(url, "basal_packed_tokens_total"), counter(url, "basal_prompt_tokens_total")
        alone_s, _ = run_batch(url, lines)
        packed = counter(url, "basal_packed_tokens_total") - packed0
        prompt = counter(url, "basal_prompt_tokens_total") - prompt0

        busy: list[float] = []  # the same batch again, with the online probe beside it
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(url, short, stop, busy))
        beside_s, _ = run_batch(url, lines, prober.start)
        stop.set()
        prober.join()
    finally:
        proc.terminate()
        proc.wait(60)
    row = {
        "model": name,
        "lines": len(lines),
        "states": states,
        "per_state": a.per_state,
        "state_tokens": a.state_tokens,
        "one_by_one_lines_per_s": one_by_one,
        "batch_lines_per_s": len(lines) / alone_s,
        "speedup": len(lines) / alone_s / one_by_one,
        "batch_lines_per_s_beside_probe": len(lines) / beside_s,
        "packed_over_prompt_tokens": packed / prompt if prompt else None,
        "one_by_one_packed_over_prompt_tokens": single_packed / single_prompt if single_prompt else None,
        "probe_requests_during_batch": len(busy),
        "online_idle_p50_ms": pct(idle, 50) * 1000,
        "online_idle_p99_ms": pct(idle, 99) * 1000,
        "online_busy_p50_ms": pct(busy, 50) * 1000 if busy else None,
        "online_busy_p99_ms": pct(busy, 99) * 1000 if busy else None,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,mini2", help="comma list of demo, mini2 (mini shapes cut to 2 layers)")
    ap.add_argument("--states", type=int, default=200, help="states of the demo batch (default 200)")
    ap.add_argument("--mini-states", type=int, default=10, help="states of the mini batch (default 10)")
    ap.add_argument("--per-state", type=int, default=10, help="questions (lines) per state (default 10)")
    ap.add_argument("--state-tokens", type=int, default=128, help="tokens of each state (default 128)")
    ap.add_argument("--probes", type=int, default=50, help="online probe requests with no batch (default 50)")
    ap.add_argument("--out", default="bench/results/batch_speed.json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            if name == "demo":
                path = synth_model(Path(tmp) / "demo", "demo")
            elif name == "mini2":
                path = synth_model(Path(tmp) / "mini2", "mini", layers=2)
            else:
                raise SystemExit(f"unknown model {name!r}: demo or mini2")
            rows.append(run_model(name, path, a, Path(tmp)))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load": os.getloadavg(), "cpus": os.cpu_count(), "rows": rows}, indent=2))
    print(f"load average {os.getloadavg()}; written {out}")


if __name__ == "__main__":
    main()
