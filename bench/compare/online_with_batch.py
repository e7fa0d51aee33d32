"""Online latency with a batch running against without: one client, one request after another, on `basal serve`.

    python -m bench.compare.online_with_batch              # demo model, 200 requests each way, 20,000-line batch
    python -m bench.compare.online_with_batch --requests 100 --rounds 2 --lines 10000
    python -m bench.compare.online_with_batch --before DIR --rounds 4    # and a server of another checkout

A `basal serve` child (loopback, the demo model unless `--model`, its own batch store) answers one client that sends
one-question requests on distinct ~`--state-tokens`-token states (so the answer cache never answers), one after
another over one keep-alive connection. Each round measures `--requests` of them with nothing else running
("alone"), then uploads a batch of `--lines` lines (10 questions per state, distinct states), waits until
`--warm-lines` of them are recorded (past its start: the batch runs steadily), measures `--requests` more while it
runs ("batch"), and cancels it. The batch must still be running when the last online request ends (else the round
says so); its lines/s while the online client ran are printed too (what the batch gets beside it).

Per request the server's own split is read from its headers: `x-basal-queue-ms` (waiting for the device),
`x-basal-compute-ms` (its pass, pauses included); the rest of the client's time (HTTP, the event loop, admission,
the answer's way back) is "outside". Prints p50 / p99 / max of each, and the ratios batch / alone. Numbers are
ratios within one run; the machine's load is printed with them. `--before DIR` also starts a server from another
checkout (its PYTHONPATH); each round then measures both, in alternating order, with the same requests and batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from basal.benchsuite.workloads import questions, state_of_tokens
from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import demo_model
from bench import report
from bench.lab.http_speed import healthy, metric_total
from tests.ports import free_port

PER_STATE = 10  # questions per state in the batch, one line each (a ticket-scoring job)


def start(model: str, home: Path, extra: list[str], pythonpath: str | None) -> tuple[subprocess.Popen, str]:
    """A `basal serve` child on a free loopback port with its own BASAL_HOME (its batch store); `pythonpath`: the
    checkout it runs (None: this one)."""
    port = free_port()
    env = {**os.environ, "BASAL_HOME": str(home)}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, "-m", "basal", "serve", "--model", model, "--addr", f"127.0.0.1:{port}", *extra]
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "serve.log", "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, healthy(proc, f"http://127.0.0.1:{port}", 180)


def batch_file(model: ModelDir, lines: int, state_tokens: int, seed: int) -> bytes:
    out = []
    for s in range(-(-lines // PER_STATE)):
        state = state_of_tokens(model.tokenizer, state_tokens, "en", seed + s)
        for i, (name, q) in enumerate(questions(PER_STATE, "en", seed + s).items()):
            if len(out) < lines:
                body = {"state": state, "questions": {name: q}}
                line = {"custom_id": f"s{s}-q{i}", "method": "POST", "url": "/v1/basal", "body": body}
                out.append(json.dumps(line).encode())
    return b"\n".join(out) + b"\n"


def online(client: httpx.Client, bodies: list[dict]) -> list[tuple[float, float, float]]:
    """Each request's (client ms, queue ms, compute ms), one after another."""
    out = []
    for body in bodies:
        started = time.perf_counter()
        r = client.post("/v1/basal", json=body)
        ms = (time.perf_counter() - started) * 1000
        assert r.status_code == 200, r.text
        out.append((ms, float(r.headers["x-basal-queue-ms"]), float(r.headers["x-basal-compute-ms"])))
    return out


def batch_passes(client: httpx.Client) -> tuple[float, float]:
    """(requests, passes) of the background lanes so far, from `/metrics` (the server's `--metrics`); zeros without."""
    r = client.get("/metrics")
    text = r.text if r.status_code == 200 else ""

    def background(labels: dict[str, str]) -> bool:
        return labels.get("lane") in ("long", "background")

    return tuple(metric_total(text, f"basal_batch_requests_{part}", background) for part in ("sum", "count"))


def per_pass(a: tuple[float, float], b: tuple[float, float]) -> float:
    return round((b[0] - a[0]) / (b[1] - a[1]), 1) if b[1] > a[1] else 0.0


def with_batch(client: httpx.Client, data: bytes, bodies: list[dict], warm: int, alone_s: float) -> tuple[list, dict]:
    """`bodies` online while a batch of `data` runs, from its `warm`-th recorded line on (past its start, when
    the first lines are admitted and nothing is on the device yet), after `alone_s` of the batch by itself; -> their
    times and the batch at the end (with its lines/s alone and beside the online client)."""
    file = client.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}).json()
    batch = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": "/v1/basal",
                                             "completion_window": "24h"}).json()  # fmt: skip
    deadline = time.monotonic() + 120
    while True:  # until its lines run steadily: the engine's background lane is busy
        now = client.get(f"/v1/batches/{batch['id']}").json()
        if now["request_counts"]["completed"] >= warm or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    alone_started, passes_alone = time.perf_counter(), batch_passes(client)
    time.sleep(alone_s)  # the batch by itself: its rate without the online client
    before, passes_beside = now, batch_passes(client)
    now = client.get(f"/v1/batches/{batch['id']}").json()
    alone = (now["request_counts"]["completed"] - before["request_counts"]["completed"]) / (
        time.perf_counter() - alone_started
    )
    started = time.perf_counter()
    times = online(client, bodies)
    seconds = time.perf_counter() - started
    at_end = client.get(f"/v1/batches/{batch['id']}").json()
    at_end["lines_per_s"] = (at_end["request_counts"]["completed"] - now["request_counts"]["completed"]) / seconds
    at_end["lines_per_s_alone"] = alone
    # requests per pass of its lanes (with --serve-arg=--metrics): alone, and beside the online client
    at_end["lines_per_pass"] = [per_pass(passes_alone, passes_beside), per_pass(passes_beside, batch_passes(client))]
    client.post(f"/v1/batches/{batch['id']}/cancel")
    while client.get(f"/v1/batches/{batch['id']}").json()["status"] not in ("cancelled", "completed", "failed"):
        time.sleep(0.1)
    return times, at_end


def stats(times: list[tuple[float, float, float]]) -> dict:
    a = np.array(times)
    parts = {"total": a[:, 0], "queue": a[:, 1], "compute": a[:, 2], "outside": a[:, 0] - a[:, 1] - a[:, 2]}
    return {
        k: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "max": float(v.max())}
        for k, v in parts.items()
    }


def table(rows: dict) -> None:
    parts = ["alone p50", "alone p99", "alone max", "batch p50", "batch p99", "batch max", "p50 ratio", "p99 ratio"]
    print("| server | part | " + " | ".join(parts) + " |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        for part in ("total", "queue", "compute", "outside"):
            x, y = row["alone"][part], row["batch"][part]
            ratio = [f"{y[k] / x[k]:.2f}×" if x[k] > 0.01 else "—" for k in ("p50", "p99")]
            print(f"| {name} | {part} ms | {x['p50']:.1f} | {x['p99']:.1f} | {x['max']:.1f} | {y['p50']:.1f} | "
                  f"{y['p99']:.1f} | {y['max']:.1f} | {ratio[0]} | {ratio[1]} |")  # fmt: skip
    for name, row in rows.items():
        for b in row["batch_at_end"]:
            print(f"{name}: the batch when the last online request ended: {b}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="model directory, or demo (default)")
    ap.add_argument("--requests", type=int, default=200, help="online requests each way and round (default 200)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--lines", type=int, default=20000, help="lines of the batch (default 20000)")
    ap.add_argument("--state-tokens", type=int, default=64, help="tokens of each state, online and batch (64)")
    ap.add_argument("--warm-lines", type=int, default=1000, help="lines recorded before the online client starts")
    ap.add_argument("--alone-s", type=float, default=2.0, help="seconds of the batch alone, before the client starts")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more `basal serve` argument (repeat)")
    ap.add_argument("--before", metavar="DIR", help="also a server from this checkout (PYTHONPATH), rounds alternating")
    ap.add_argument("--out", default="bench/results/online_with_batch.json")
    a = ap.parse_args(argv)

    checkouts = {"this": None, **({"before": a.before} if a.before else {})}
    with tempfile.TemporaryDirectory(prefix="basal-online-batch-") as tmp:
        model = demo_model() if a.model == "demo" else ModelDir.load(Path(a.model))
        n = a.requests

        def bodies(seed: int) -> list[dict]:
            return [{"state": state_of_tokens(model.tokenizer, a.state_tokens, "en", seed + i),
                     "questions": questions(1, "en", seed + i)} for i in range(n)]  # fmt: skip

        servers = {name: start(a.model, Path(tmp) / name, a.serve_arg, path) for name, path in checkouts.items()}
        runs = {name: {"alone": [], "batch": [], "batches": []} for name in servers}
        try:
            clients = {name: httpx.Client(base_url=url, timeout=600) for name, (_, url) in servers.items()}
            for client in clients.values():
                online(client, bodies(10**6)[:20])  # warm-up
            for r in range(a.rounds):
                order = list(clients) if r % 2 == 0 else list(reversed(clients))
                for name in order:  # the same requests and batch for each server
                    client, run = clients[name], runs[name]
                    run["alone"] += online(client, bodies(2 * 10**6 + 2 * r * n))
                    data = batch_file(model, a.lines, a.state_tokens, 3 * 10**6 + r * a.lines)
                    times, at_end = with_batch(
                        client, data, bodies(2 * 10**6 + (2 * r + 1) * n), a.warm_lines, a.alone_s
                    )
                    run["batch"] += times
                    run["batches"].append(at_end)
            for client in clients.values():
                client.close()
        finally:
            for proc, _ in servers.values():
                proc.terminate()
            for proc, _ in servers.values():
                proc.wait(60)
    rows = {
        name: {
            "alone": stats(run["alone"]),
            "batch": stats(run["batch"]),
            "batch_at_end": [
                {
                    "status": b["status"],
                    **b["request_counts"],
                    "lines_per_s_alone": round(b["lines_per_s_alone"], 1),
                    "lines_per_s_beside_online": round(b["lines_per_s"], 1),
                    "lines_per_pass_alone_beside": b["lines_per_pass"],
                }
                for b in run["batches"]
            ],
        }
        for name, run in runs.items()
    }
    result = {"machine": report.machine(), "load": os.getloadavg(), "args": vars(a), "rows": rows}
    report.write_json(a.out, result)
    print(f"\n{a.model}, one client, {a.requests} requests each way x {a.rounds} round(s), {a.state_tokens}-token "
          f"states; batch of {a.lines} lines; load average {result['load'][0]:.1f}\n")  # fmt: skip
    table(rows)
    return result


if __name__ == "__main__":
    main()
