"""The exit status after SIGTERM: 0 when the drain finished every request in flight (a clean stop, what
`docker stop` and Kubernetes expect), the signal's own (-15 here, 143 in a shell) when the grace period ran out and
requests were abandoned. Each run is a fresh interpreter serving on its main thread, where uvicorn takes signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVE_AND_STOP = """
import os, signal, sys, threading, time
import httpx
from basal.api.app import create_app
from basal.api.listener import DrainingServer, server_config
from basal.core.model.synth import demo_model
from tests.servers import free_port, make_engines

grace_s = float(sys.argv[1])
engines = make_engines(demo_model(), slow_s=0.5, yields_per_layer=5)  # a request computes for a second or more
port = free_port()
server = DrainingServer(server_config(create_app(engines), "127.0.0.1", port, log_level="warning"), engines, grace_s)
body = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}

def client():
    while not server.started:
        time.sleep(0.02)
    threading.Thread(target=lambda: print(httpx.post(f"http://127.0.0.1:{port}/v1/systemone", json=body,
                                                     timeout=60).status_code, flush=True)).start()
    while not engines.engines["basal-synthetic-demo"].pipeline.backend.yields:  # computing
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=client, daemon=True).start()
server.run()
print("after run", flush=True)
"""


@pytest.mark.parametrize(
    ("grace_s", "status", "answered"), [(30.0, 0, "200"), (0.2, -signal.SIGTERM, "503")], ids=["drained", "abandoned"]
)
def test_sigterm_exit_status_says_whether_the_drain_was_complete(grace_s, status, answered):
    done = subprocess.run(
        [sys.executable, "-c", SERVE_AND_STOP, str(grace_s)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=90,
    )
    assert done.returncode == status, done.stderr[-3000:]
    assert done.stdout.split()[0] == answered
