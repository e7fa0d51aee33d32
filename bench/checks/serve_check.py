"""`basal serve` itself, checked over HTTP (bench/checks/gpu_check.py's P3 runs it on the GPU machine, docs/gpu-path.md
§8.2): a server in a child process on a synthetic checkpoint on disk must start on the expected path, answer both
dialects, give the README request the same answers twice and among concurrent requests it is batched with, send
its timing headers and shut down gracefully on SIGTERM; single decisions are timed over HTTP. Standard library
only on this side (urllib, threads), so it runs where basal's server packages are carried as wheels.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 2  # the checkpoint: mini shapes (demo in the dry run) cut to 2 layers
SERVE_REQUESTS = 20  # sequential single decisions timed over HTTP
SERVE_LOAD = 16  # concurrent requests, half of them the same: their answers must not change in a batch
SERVE_PACKAGES = ("litestar", "msgspec", "uvicorn")  # what the GPU image lacks: tests/gpu/serve-wheels.txt
PATHS = {  # where `basal serve --backend auto` should run, judged from /v1/models' `compute`
    "cuda": lambda c: str(c.get("path", "")).startswith("gpu") and str(c["device"]).startswith("cuda"),
    "metal": lambda c: c["backend"] == "mlx" and c["device"] == "metal",
    "cpu": lambda c: c["device"] == "cpu",
}

SERVE_BODY = {  # the README's first request
    "model": "jev-latest",
    "state": "Help! My payouts have been failing for 3 days.",
    "questions": {
        "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "Payments, invoicing, refunds", "technical": "Bugs, outages"},
        },
    },
}
BASAL_BODY = {
    "state": "Order 42 arrived two weeks late.",
    "questions": {"late": {"type": "noul", "instructions": "Late?"}},
}


def http(url: str, body: dict | None = None, timeout: float = 60.0) -> tuple[int, dict, object]:
    """(status, headers, parsed JSON) of a GET, or of a POST of `body`; an HTTP error status is a result too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"null")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, server, until: float) -> bool:
    """Poll /health until it answers 200, the server exits, or `until` (perf_counter) passes."""
    while time.perf_counter() < until and server.poll() is None:
        try:
            if http(url + "/health", timeout=2)[0] == 200:
                return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    return False


def under_load(url: str, n: int) -> dict:
    """`n` requests at once, every other one the README's request and the rest on other states, so the engine
    batches them: the README's answers must keep the bits they have alone. -> statuses, the README's (status,
    answers), the largest batch the server reported, the wall time."""
    bodies = [
        SERVE_BODY if i % 2 == 0 else {**SERVE_BODY, "state": f"Ticket {i}: the invoice for order {i} is wrong."}
        for i in range(n)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        done = list(pool.map(lambda body: http(url + "/v1/systemone", body), bodies))
    return {
        "requests": n,
        "statuses": [status for status, _, _ in done],
        "readme_answers": [
            (status, answers) for (status, _, answers), b in zip(done, bodies, strict=True) if b is SERVE_BODY
        ],
        "largest_batch": max(int(headers.get("x-basal-batch-requests", 0)) for _, headers, _ in done),
        "wall_ms": (time.perf_counter() - started) * 1e3,
    }


def serve_checks(expect: str, demo: bool, deadline: float = math.inf) -> dict:
    """`basal serve` in a child process on a checkpoint on disk (mini shapes cut to 2 layers, or the demo model's
    with `demo`): it must start by itself on the `expect`ed path (`PATHS`: the GPU path on "cuda", MLX on "metal",
    the CPU), answer the README's System One request with the same bytes twice and among concurrent requests it is
    batched with, and a basal-dialect one, with its `x-basal-*` timing headers; then single decisions one after
    another over HTTP, timed. Skipped where its packages are missing (the GPU image: carry them, `make
    gpu-wheels`). `deadline` (perf_counter): the budget it should keep to; a start gets 90 s at least."""
    from basal.core.model.synth import synth_model

    probe = subprocess.run([sys.executable, "-c", "import " + ", ".join(SERVE_PACKAGES)], capture_output=True)
    if probe.returncode != 0:
        missing = probe.stderr.decode(errors="replace").strip().splitlines()[-1:]
        return {"skipped": f"basal serve's packages are not importable ({'; '.join(missing)}): run `make gpu-wheels`"
                " and carry .whl (docs/gpu-path.md §8.2)"}  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_serve.") as tmp:
        model = synth_model(Path(tmp) / "model", "demo" if demo else "mini", layers=LAYERS)
        port, log_path = free_port(), Path(tmp) / "serve.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("TRITON_INTERPRET", None)  # gpu_check's dry run sets it; a server on the CPU runs plain torch
        argv = [sys.executable, "-m", "basal", "serve", "--model", str(model), "--addr", f"127.0.0.1:{port}"]
        with open(log_path, "w") as log:
            server = subprocess.Popen([*argv, "--no-access-log"], stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            patience = min(300.0, max(90.0, deadline - time.perf_counter()))  # a start may outlast the budget
            healthy = wait_healthy(url, server, time.perf_counter() + patience)
            ready_s = time.perf_counter() - started
            if not healthy:
                why = (
                    f"exited with {server.returncode}"
                    if server.poll() is not None
                    else f"not healthy in {patience:.0f} s"
                )
                return {"error": f"basal serve {why}", "log": log_path.read_text()[-3000:]}
            _, _, models = http(url + "/v1/models")
            compute = models["models"][0]["compute"]
            first, second = http(url + "/v1/systemone", SERVE_BODY), http(url + "/v1/systemone", SERVE_BODY)
            basal = http(url + "/v1/basal", BASAL_BODY)
            burst = under_load(url, SERVE_LOAD)
            single = {**SERVE_BODY, "questions": {"urgent": SERVE_BODY["questions"]["urgent"]}}
            wall, compute_ms = [], []
            for _ in range(SERVE_REQUESTS):
                t = time.perf_counter()
                _, headers, _ = http(url + "/v1/systemone", single)
                wall.append((time.perf_counter() - t) * 1e3)
                compute_ms.append(float(headers.get("x-basal-compute-ms", "nan")))
        finally:
            server.send_signal(signal.SIGTERM)  # what a supervisor sends: drain, shut down, re-raise the signal
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        checks = {
            f"{expect}_path": PATHS[expect](compute),
            "systemone_200": first[0] == 200 and set(first[2]["answers"]) == set(SERVE_BODY["questions"]),
            "same_answers_twice": first[2] == second[2],
            "same_answers_under_load": all(r == (200, first[2]) for r in burst["readme_answers"]),
            "under_load_all_200": burst["statuses"] == [200] * len(burst["statuses"]),
            "basal_200": basal[0] == 200,
            "timing_headers": "x-basal-compute-ms" in first[1] and "x-basal-queue-ms" in first[1],
            "graceful_shutdown": server.returncode in (0, -signal.SIGTERM)
            and "Application shutdown complete" in log_path.read_text(),
        }
        return {
            "checks": checks,
            "compute": compute,
            "ready_s": ready_s,
            "http_single_ms_median": statistics.median(wall),
            "http_single_ms_p90": sorted(wall)[int(0.9 * (len(wall) - 1))],
            "compute_ms_median": statistics.median(compute_ms),
            "under_load": {k: v for k, v in burst.items() if k != "readme_answers"},
            "log_tail": log_path.read_text()[-1500:],
            "seconds": time.perf_counter() - started,
        }


def verdict(checks: dict[str, bool]) -> str:
    """A table's cell for named checks: "yes", or "NO " and the ones that failed."""
    failed = [name for name, ok in checks.items() if not ok]
    return "NO " + ",".join(failed) if failed else "yes"


def not_run(result: dict) -> str:
    """A table's cell for a part that did not give results: its error, or why it was skipped."""
    return "ERROR " + result["error"] if "error" in result else result.get("skipped", "?")


def serve_lines(r: dict | None) -> list[str]:
    """P3's `basal serve` over HTTP: where it ran, how long it took to start, single decisions over HTTP."""
    if r is None:
        return []
    if "checks" not in r:
        return ["", f"basal serve over HTTP: {not_run(r)}"]
    c, u = r["compute"], r.get("under_load")
    load = f" {u['requests']} requests at once in batches of up to {u['largest_batch']};" if u else ""
    return [
        "",
        f"basal serve over HTTP ({c['backend']} {c['device']} {c['dtype']}, {c.get('path', 'portable path')}): ready in"
        f" {r['ready_s']:.1f} s; single decision {r['http_single_ms_median']:.2f} ms over HTTP (p90"
        f" {r['http_single_ms_p90']:.2f}), compute {r['compute_ms_median']:.2f} ms;{load}"
        f" checks {verdict(r['checks'])}",
    ]
