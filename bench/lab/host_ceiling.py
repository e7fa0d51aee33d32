"""How many requests per second the host side of basal sustains when the device costs nothing: the ceiling a GPU
server's CPU puts on throughput, whatever the GPU (docs/gpu-path.md §7: upstream reaches 250 req/s on an H100 at
32 clients, basal aims at 400 or more).

    python -m bench.lab.host_ceiling                # the README's request and one yes/no question, 1 / 8 / 32 clients
    python -m bench.lab.host_ceiling --floor-ms 2   # a device whose forward takes 2 ms (mini's single decision)
    python -m bench.lab.host_ceiling --gc-baseline  # beside a server that keeps its start-up heap in the GC

The server is basal's HTTP app (uvicorn, Litestar, the contract, the engine's lanes, admission, tree packing,
the decision math and the answers) in its own process, over a simulated device whose forwards take
`--floor-ms` and return zeros (bench/lab/lane_overlap.py), on loopback; the clients are threads with one keep-alive
connection each (bench/lab/http_speed.py). The baseline, in the same run: the same engine called in-process, without
HTTP. The server process's CPU time per request comes from /proc (Linux); its own time per request from its
`x-basal-total-ms` header (the clients' latency adds their side: on a small machine their threads share its cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from basal.core.engine.memory import freeze_startup_heap
from bench.checks.serve_check import SERVE_BODY
from bench.lab.http_speed import healthy, in_process, over_http
from tests.ports import free_port

ONE_QUESTION = {**SERVE_BODY, "questions": {"urgent": SERVE_BODY["questions"]["urgent"]}}
REQUESTS = {"README request (noul + choice)": SERVE_BODY, "one yes/no question": ONE_QUESTION}


def engines_on_simulated_device(floor_ms: float):
    """The demo model's engines over a device whose every forward takes `floor_ms` (two batches in flight)."""
    from basal.core.model.synth import demo_model
    from bench.lab.lane_overlap import SimulatedDevice, started_engines

    model = demo_model()
    engines, _ = started_engines(model, SimulatedDevice(model, floor_ms / 1000, 0.0, overlap=True))
    return engines


def serve(port: int, floor_ms: float, gc_freeze: bool = True) -> None:
    """The child process: basal's app over the simulated device, through `basal serve`'s own `listen` (with
    `gc_freeze=False`, without its freeze of the start-up heap: the baseline)."""
    import logging

    from basal.serve import server
    from basal.serve.config import ServeConfig

    logging.basicConfig(level=logging.WARNING)
    if not gc_freeze:
        server.freeze_startup_heap = lambda: 0
    server.listen(engines_on_simulated_device(floor_ms), ServeConfig(addr=f"127.0.0.1:{port}", shutdown_grace_s=1))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_row(proc: subprocess.Popen, url: str, body: dict, clients: int, per: int) -> tuple[dict, float | None]:
    """`over_http`'s summary and the server's CPU ms per request (None without /proc)."""
    before = cpu_seconds(proc.pid)
    h = over_http(url, body, clients, per)
    after = cpu_seconds(proc.pid)
    return h, (after - before) * 1e3 / h["requests"] if before is not None and after is not None else None


def start(floor_ms: float, gc_freeze: bool = True) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.lab.host_ceiling", "--serve", str(port), "--floor-ms", str(floor_ms)]
    argv += [] if gc_freeze else ["--no-gc-freeze"]
    proc = subprocess.Popen(
        argv, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, healthy(proc, f"http://127.0.0.1:{port}", timeout_s=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="requests per row")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--floor-ms", type=float, default=0.0, help="device time of every forward (0: free)")
    ap.add_argument("--gc-baseline", action="store_true", help="also a server without the start-up heap's freeze")
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the server child
    ap.add_argument("--no-gc-freeze", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        return serve(a.serve, a.floor_ms, gc_freeze=not a.no_gc_freeze)
    servers = {"basal serve": start(a.floor_ms)}
    if a.gc_baseline:
        servers["without gc.freeze"] = start(a.floor_ms, gc_freeze=False)
    engines = engines_on_simulated_device(a.floor_ms)
    freeze_startup_heap()  # the clients' process too: its own collector pauses would show as server latency
    rows, turn = [], 0
    try:
        for label, body in REQUESTS.items():
            in_process(engines, body, 1, 20)  # warm-up
            for _, url in servers.values():
                over_http(url, body, 1, 20)
            for clients in a.clients:
                per = max(1, a.requests // clients)
                turn += 1
                order = list(servers)[:: 1 if turn % 2 else -1]  # who goes first alternates from row to row
                measured = {name: http_row(*servers[name], body, clients, per) for name in order}
                p = in_process(engines, body, clients, per)
                rows += [(label, clients, name, *measured[name], p) for name in servers]
                print(f"{label}, {clients} clients: in-process {p['rps']:.0f} req/s", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        engines.close()
    print(f"\ndevice: {a.floor_ms:g} ms per forward; {os.cpu_count()} CPUs\n")
    print(
        "| request | clients | server | HTTP req/s | HTTP p50 / p99 ms | server's own p50 / p99 / max ms "
        "| server CPU ms per request | in-process req/s | HTTP / in-process |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, clients, name, h, cpu_ms, p in rows:
        cpu = f"{cpu_ms:.2f}" if cpu_ms is not None else "-"
        server = f"{h['server_p50_ms']:.2f} / {h['server_p99_ms']:.2f} / {h['server_max_ms']:.1f}"
        print(
            f"| {label} | {clients} | {name} | {h['rps']:.0f} | {h['p50_ms']:.2f} / {h['p99_ms']:.2f} | {server} "
            f"| {cpu} | {p['rps']:.0f} | {h['rps'] / p['rps']:.2f} |"
        )


if __name__ == "__main__":
    main()
