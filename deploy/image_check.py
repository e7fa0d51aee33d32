"""`make image-check`: run the CPU image as a user would and check what the issue promises (docs/install.md).

    python deploy/image_check.py IMAGE              # every check must pass
    python deploy/image_check.py IMAGE --negative   # negative control: run as root, stop with SIGKILL; the checks
                                                    # for root, for the drain and for a clean exit must each fail

The container runs with --network host (no bridge on this machine class) on a loopback port, a read-only root
file system and a fresh named volume for /data. Checks: the processes are not root; /health, /health/live and
/health/ready answer 200; a setting from the environment applies; one decision; /v1/models reports compiled CPU
kernels (built into the image); Docker's HEALTHCHECK turns healthy; `docker stop` while a long decision is in
flight lets it finish (200) and the process exits cleanly.
Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import uuid

DECISION = {  # the README's request
    "model": "jev-latest",
    "state": "Help! My payouts have been failing for 3 days.",
    "questions": {
        "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "Payments, invoicing, refunds", "technical": "Bugs, outages"}},
    },
}  # fmt: skip


def long_decision() -> dict:
    """A decision of several seconds on the demo model (128 yes/no questions, a 40-way choice, a long state)."""
    state = " ".join(f"Zdanie numer {i} o zamówieniu i płatności, które nie dotarło na czas." for i in range(200))
    questions = {f"q{i}": {"type": "noul", "instructions": f"Czy zdanie {i} mówi o opóźnieniu?"} for i in range(128)}
    criteria = {f"team{i}": f"Team number {i} handles case {i}" for i in range(40)}
    questions["team"] = {"type": "choice", "instructions": "Which team?", "criteria": criteria}
    return {"model": "jev-latest", "state": state, "questions": questions}


def docker(*args: str, check: bool = True, timeout: float = 120, both: bool = False) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return (done.stdout + done.stderr).strip() if both else done.stdout.strip()


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


MAX_INFLIGHT = 7  # given by the environment; /health/ready reports it


def wait_for_health(port: int, name: str, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if docker("inspect", "-f", "{{.State.Running}}", name) != "true":
            raise RuntimeError("the container stopped:\n" + docker("logs", "--tail", "30", name, check=False))
        try:
            if request(port, "GET", "/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"/health did not answer 200 within {limit_s:g} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--port", type=int, default=18017)
    parser.add_argument("--negative", action="store_true", help="run as root and stop with SIGKILL: checks must fail")
    args = parser.parse_args()
    name = f"basal-image-check-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-data"
    results: dict[str, bool] = {}

    def record(check: str, ok: bool, detail: str = "") -> None:
        results[check] = ok
        print(f"{'ok  ' if ok else 'FAIL'} {check}{': ' + detail if detail else ''}", flush=True)

    run = ["run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
           "-v", f"{volume}:/data", "-e", f"BASAL_ADDR=127.0.0.1:{args.port}",
           "-e", f"BASAL_MAX_INFLIGHT={MAX_INFLIGHT}"]  # fmt: skip
    if args.negative:
        run += ["--user", "0:0"]
    docker(*run, args.image)
    try:
        wait_for_health(args.port, name)
        record("/health answers 200", True)

        live, ready = request(args.port, "GET", "/health/live"), request(args.port, "GET", "/health/ready")
        loaded = ready[0] == 200 and set(ready[1].get("models", {}).values()) == {"loaded"}
        record("/health/live and /health/ready answer 200, every model loaded", live[0] == 200 and loaded, f"{ready}")
        record(
            "a setting from the environment (BASAL_MAX_INFLIGHT) applies",
            ready[1].get("max_inflight") == MAX_INFLIGHT,
            f"max_inflight {ready[1].get('max_inflight')}",
        )

        users = [line.split()[0] for line in docker("top", name, "-eo", "uid,pid,args").splitlines()[1:]]
        record("no process runs as root", bool(users) and "0" not in users, f"uids {sorted(set(users))}")

        status, answer = request(args.port, "POST", "/v1/systemone", DECISION)
        ok = status == 200 and set(answer.get("answers", answer)) >= {"urgent", "team"}
        record("one decision (the README's request)", ok, f"{status} {json.dumps(answer)[:160]}")

        status, models = request(args.port, "GET", "/v1/models")
        record("the image's compiled CPU kernels are used", '"compiled"' in json.dumps(models), f"{status}")

        deadline = time.monotonic() + 45
        health = ""
        while time.monotonic() < deadline and (health := docker("inspect", "-f", "{{.State.Health.Status}}", name)) \
                != "healthy":  # fmt: skip
            time.sleep(2)
        record("Docker's HEALTHCHECK turns healthy", health == "healthy", health)

        in_flight: dict[str, object] = {}

        def long_call() -> None:
            started = time.monotonic()
            try:
                in_flight["status"] = request(args.port, "POST", "/v1/systemone", long_decision(), timeout=120)[0]
            except OSError as e:
                in_flight["status"] = f"{type(e).__name__}: {e}"
            in_flight["seconds"] = time.monotonic() - started

        caller = threading.Thread(target=long_call)
        caller.start()
        time.sleep(2.0)  # the request is being computed
        stop_started = time.monotonic()
        if args.negative:
            docker("kill", "--signal", "KILL", name)
        else:
            docker("stop", "--time", "60", name, timeout=90)
        caller.join(150)
        stopped_s = time.monotonic() - stop_started
        finished_after_stop = in_flight.get("seconds", 0) > 2.0
        record(
            "docker stop lets the request in flight finish",
            in_flight.get("status") == 200 and finished_after_stop,
            f"{in_flight.get('status')} after {in_flight.get('seconds', 0):.1f} s; stop took {stopped_s:.1f} s",
        )
        # a SIGTERM whose drain finished everything exits 0 (basal.api.http.listener); 143: requests were abandoned,
        # 137 a kill
        code = docker("inspect", "-f", "{{.State.ExitCode}}", name)
        drained = "Application shutdown complete" in docker("logs", name, check=False, both=True)
        record(
            "the process exits cleanly",
            code == "0" and drained,
            f"exit code {code}, {'after' if drained else 'WITHOUT'} uvicorn's 'Application shutdown complete'",
        )
    except Exception as e:  # reported as a failed check, with the container's log
        record("the container serves", False, str(e))
    finally:
        log = docker("logs", "--tail", "15", name, check=False, timeout=30, both=True)
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", "-f", volume, check=False)
    if any(not ok for ok in results.values()):
        print("--- the container's last log lines\n" + log, flush=True)

    if args.negative:
        expected = ["no process runs as root", "docker stop lets the request in flight finish",
                    "the process exits cleanly"]  # fmt: skip
        missed = [check for check in expected if results.get(check, True)]
        print("negative control: " + ("every check saw its fault" if not missed else f"NOT SEEN: {missed}"))
        return 1 if missed else 0
    print("image-check: " + ("passed" if all(results.values()) else "FAILED"))
    return 0 if results and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
