"""The Batch API's floor beside an online client that never stops, in one process (no HTTP): where the time goes.

    python -m bench.lab.batch_floor                                  # demo model, this checkout
    python -m bench.lab.batch_floor --before DIR --rounds 3          # and another checkout's basal, alternating

Engines on the demo model (the gate's defaults: `long_share` 0.25, `long_slice_ms` 100). One client sends
one-question requests on distinct ~64-token states one after another, alone ("online alone"); then a batch of
background lines (10 questions per state, one line each, a window of 256 in flight as the batch runner keeps) runs
by itself for `--alone-s` ("batch alone"), and then beside the client for `--requests` requests ("beside"). Per
phase it prints the online p50 / p99, the batch's lines/s, and from the gate: the long lane's device seconds, its
host-work seconds (`host_seconds`, where the checkout has it), the main lanes' busy seconds while the batch waited,
and the floor turns. Each checkout runs in a child process of its own (`PYTHONPATH=DIR`), rounds alternating.
Numbers are ratios within one run on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PER_STATE, WINDOW = 10, 256
GATE_COUNTERS = ("long_seconds", "host_seconds", "main_seconds_over_long", "floor_turns", "preemptions")


async def phases(requests: int, lines: int, alone_s: float) -> dict:
    from basal.benchsuite.report import pct
    from basal.benchsuite.workloads import questions, state_of_tokens
    from basal.core.model.synth import demo_model
    from basal.core.request.dialects import parse_basal
    from tests.servers import make_engines

    model = demo_model()
    engines = make_engines(model)
    engines.start()
    engine = engines.engines[model.name]
    gate = engine.gate

    def req(seed: int, n: int, i: int = 0):
        body = {"model": model.name, "state": state_of_tokens(model.tokenizer, 64, "en", seed)}
        body["questions"] = dict([list(questions(n, "en", seed).items())[i]])
        return parse_basal(body, lambda m: m)

    def counters() -> dict:
        return {"t": time.perf_counter(), "passes": engine.passes, **{k: getattr(gate, k, 0.0) for k in GATE_COUNTERS}}

    def delta(a: dict, b: dict, done: int, online: int = 0) -> dict:
        out = {k: round(b[k] - a[k], 3) for k in GATE_COUNTERS}
        passes = b["passes"] - a["passes"] - online  # the batch's
        return {"seconds": round(b["t"] - a["t"], 3), "lines": done, "batch_passes": passes, **out}

    async def client(seed: int) -> list[float]:
        ms = []
        for i in range(requests):
            started = time.perf_counter()
            await engines.run(req(seed + i, 1))
            ms.append((time.perf_counter() - started) * 1000)
        return ms

    await client(10**6)  # warm-up
    alone_ms = await client(2 * 10**6)
    stop, done = False, [0]

    async def batch() -> None:
        slots = asyncio.Semaphore(WINDOW)

        async def one(r) -> None:
            try:
                await engines.run(r, lambda: stop, background=True)
                done[0] += 1
            except Exception:  # cancelled when the measurement ends
                pass
            finally:
                slots.release()

        tasks = []
        for n in range(lines):
            await slots.acquire()
            if stop:
                break
            tasks.append(asyncio.create_task(one(req(3 * 10**6 + n // PER_STATE, PER_STATE, n % PER_STATE))))
        await asyncio.gather(*tasks)

    runner = asyncio.create_task(batch())
    await asyncio.sleep(0.5)  # past its start
    a, d0 = counters(), done[0]
    await asyncio.sleep(alone_s)
    b, d1 = counters(), done[0]
    beside_ms = await client(4 * 10**6)
    c, d2 = counters(), done[0]
    stop = True
    await runner
    engines.close(drain=False, timeout=10)
    batch_alone, beside = delta(a, b, d1 - d0), delta(b, c, d2 - d1, requests)
    return {
        "online_alone_ms": [round(pct(alone_ms, 50), 1), round(pct(alone_ms, 99), 1)],
        "online_beside_ms": [round(pct(beside_ms, 50), 1), round(pct(beside_ms, 99), 1)],
        "lines_per_s_alone": round(batch_alone["lines"] / batch_alone["seconds"], 1),
        "lines_per_s_beside": round(beside["lines"] / beside["seconds"], 1),
        "gate_batch_alone": batch_alone,
        "gate_beside": beside,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="online requests each way (default 300)")
    ap.add_argument("--lines", type=int, default=20000, help="lines of the batch (more than it runs; 20000)")
    ap.add_argument("--alone-s", type=float, default=2.0, help="seconds of the batch by itself (2)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--before", metavar="DIR", help="also another checkout's basal (PYTHONPATH), rounds alternating")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(asyncio.run(phases(a.requests, a.lines, a.alone_s))))
        return
    here = str(Path(__file__).resolve().parents[2])
    checkouts = {"this": here, **({"before": a.before} if a.before else {})}
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    for r in range(a.rounds):
        for name in checkouts if r % 2 == 0 else reversed(checkouts):
            cmd = [sys.executable, __file__, "--child", "--requests", str(a.requests), "--lines", str(a.lines),
                   "--alone-s", str(a.alone_s)]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": checkouts[name]}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=checkouts[name])
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(name, json.dumps(runs[name][-1]), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f}; medians over {a.rounds} round(s)")
    for name, rs in runs.items():
        alone = statistics.median(x["lines_per_s_alone"] for x in rs)
        beside = statistics.median(x["lines_per_s_beside"] for x in rs)
        ratio = statistics.median(x["lines_per_s_beside"] / x["lines_per_s_alone"] for x in rs)
        ways = ("online_alone_ms", "online_beside_ms")
        p = {k: [statistics.median(x[k][i] for x in rs) for i in (0, 1)] for k in ways}
        print(f"{name}: online p50/p99 alone {p['online_alone_ms']}, beside {p['online_beside_ms']} ms; "
              f"batch {alone} lines/s alone, {beside} beside ({ratio:.2f} of alone)")  # fmt: skip


if __name__ == "__main__":
    main()
