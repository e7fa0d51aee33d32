"""How long basal takes to start, against what importing torch alone takes on the same machine, in one run.

    python -m bench.lab.start_times [--reps 5] [--json bench/results/start_times.json]

Each round runs, one after the other (so a busy moment of a shared machine falls on all of them alike):

- `python -c "import torch"`: the floor every torch-backed command pays;
- `basal decide examples/request.json` on the built-in demo model: the whole command, process start to exit;
- `basal serve` on the demo model: process start until `/health/ready` answers 200 (the server is then stopped);
- `basal run-batch` on a finished output: nothing left to do, so nothing should load.

CPU seconds (user + system, from the children's resource usage) are kept beside the wall times of the commands that
exit by themselves. One untimed round first fills the caches a first start fills (the demo model, the compiled CPU
kernels, the GEMM and tile probe tables), as on any machine after its first start. The medians are printed with
each command's excess over importing torch; the targets are 0.5 s for `decide`, 1.5 s for `serve` and at most 1 s
(absolute) for the empty `run-batch`. Wall-clock times: on a machine shared with other work they are noisy, the
differences less so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUEST = ROOT / "examples" / "request.json"
TARGETS = {"decide": 0.5, "serve": 1.5}  # seconds over `import torch`
RUN_BATCH_LIMIT = 1.0  # seconds, absolute
LINE = {"method": "POST", "url": "/v1/basal"}


def _env() -> dict[str, str]:
    """This checkout first on the path, and bytecode cached as in any installed environment (a machine that sets
    PYTHONDONTWRITEBYTECODE would compile basal's sources at every start: tenths of a second)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv`: the CPU time is what a busy machine inflates least."""
    started, cpu = time.perf_counter(), _cpu()
    subprocess.run(argv, env=_env(), cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started, _cpu() - cpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_until_ready(timeout_s: float = 120.0) -> tuple[float, dict]:
    """Seconds from spawning `basal serve` to a 200 from /health/ready, and that body (its `startup` steps)."""
    port = _free_port()
    argv = [sys.executable, "-m", "basal", "serve", "--addr", f"127.0.0.1:{port}"]
    started = time.perf_counter()
    server = subprocess.Popen(argv, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < timeout_s:
            if server.poll() is not None:
                raise RuntimeError(f"basal serve exited with status {server.returncode} before it was ready")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=1) as reply:
                    return time.perf_counter() - started, json.loads(reply.read())
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.01)
        raise RuntimeError(f"basal serve was not ready within {timeout_s:.0f} s")
    finally:
        server.terminate()
        server.wait(30)


def _finished_batch(folder: Path) -> tuple[Path, Path]:
    """An input of two lines and an output that already holds both records."""
    body = json.loads(REQUEST.read_text())
    source, output = folder / "in.jsonl", folder / "out.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"r{i}", **LINE, "body": body}) + "\n" for i in range(2)))
    subprocess.run(
        [sys.executable, "-m", "basal", "run-batch", str(source), "-o", str(output)],
        env=_env(),
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return source, output


def measure(reps: int) -> dict:
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        source, output = _finished_batch(Path(tmp))  # also the untimed first round's load: caches filled
        commands = {
            "import torch": [py, "-c", "import torch"],
            "decide": [py, "-m", "basal", "decide", str(REQUEST)],
            "run-batch (nothing left)": [py, "-m", "basal", "run-batch", str(source), "-o", str(output)],
        }
        _timed(commands["decide"])
        samples: dict[str, list[float]] = {name: [] for name in [*commands, "serve (ready)"]}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        startup: dict = {}
        for _ in range(reps):
            for name, argv in commands.items():
                wall, used = _timed(argv)
                samples[name].append(wall)
                cpu[name].append(used)
            seconds, body = _serve_until_ready()
            samples["serve (ready)"].append(seconds)
            startup = body.get("startup", {})
    medians = {name: statistics.median(s) for name, s in samples.items()}
    torch_s = medians["import torch"]
    cpu_medians = {name: statistics.median(s) for name, s in cpu.items()}
    return {
        "cpu_median_s": cpu_medians,
        "cpu_over_import_torch_s": {
            n: m - cpu_medians["import torch"] for n, m in cpu_medians.items() if n != "import torch"
        },
        "reps": reps,
        "samples_s": samples,
        "median_s": medians,
        "over_import_torch_s": {name: m - torch_s for name, m in medians.items() if name != "import torch"},
        "serve_startup_steps_s": startup,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


def verdicts(result: dict) -> list[tuple[str, bool, str]]:
    over, med = result["over_import_torch_s"], result["median_s"]
    return [
        ("decide", over["decide"] <= TARGETS["decide"], f"+{over['decide']:.2f} s (target +{TARGETS['decide']} s)"),
        (
            "serve",
            over["serve (ready)"] <= TARGETS["serve"],
            f"+{over['serve (ready)']:.2f} s (target +{TARGETS['serve']} s)",
        ),
        (
            "run-batch",
            med["run-batch (nothing left)"] <= RUN_BATCH_LIMIT,
            f"{med['run-batch (nothing left)']:.2f} s (target <= {RUN_BATCH_LIMIT} s)",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="timed rounds (default 5); each runs every command once")
    p.add_argument("--json", type=Path, help="also write the samples and medians here")
    a = p.parse_args(argv)
    result = measure(a.reps)
    print(f"medians of {a.reps} rounds (load average {', '.join(f'{x:.1f}' for x in result['load_average'])}):")
    for name, m in result["median_s"].items():
        over = result["over_import_torch_s"].get(name)
        line = f"  {name:<26} {m:6.2f} s" + (f"   ({over:+.2f} s over import torch)" if over is not None else "")
        if name in result["cpu_median_s"]:
            line += f"   CPU {result['cpu_median_s'][name]:.2f} s"
            if name in result["cpu_over_import_torch_s"]:
                line += f" ({result['cpu_over_import_torch_s'][name]:+.2f} s)"
        print(line)
    print(f"  serve's start-up steps: {result['serve_startup_steps_s']}")
    for name, ok, detail in verdicts(result):
        print(f"  {name:<10} {'within' if ok else 'OVER'} target: {detail}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
