"""`basal serve` before it listens: the port is checked first, loading shows its steps, names come from `name:`."""

from __future__ import annotations

import io
import logging
import socket

import httpx
import pytest

import basal.serve.server
from basal.cli import main
from basal.progress import Progress
from basal.serve.config import ConfigError, parse_config
from basal.serve.port_check import check_port
from tests.servers import live_server


def test_a_busy_port_is_named_before_any_model_loads(monkeypatch, capsys):
    monkeypatch.setattr(
        basal.serve.server, "build_engines", lambda *a, **k: pytest.fail("loaded before the port check")
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is already in use"):
            check_port("127.0.0.1", port)
        assert main(["serve", "--addr", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and f"--addr 127.0.0.1:{port + 1}" in err
    check_port("127.0.0.1", port)  # free again: no error
    with pytest.raises(ConfigError, match="not an address of this machine"):
        check_port("192.0.2.1", 8000)  # TEST-NET-1: never a local address


def test_progress_is_a_line_per_step_off_a_terminal_and_a_bar_on_one():
    lines: list[str] = []
    with Progress("loading", 2, tty=False, emit=lines.append) as p:
        for label in ("weights", "template prefix"):
            with p.step(label):
                pass
    assert lines == ["loading [1/2] weights", "loading [2/2] template prefix"]
    quiet: list[str] = []
    with Progress("bench", tty=False, emit=quiet.append, min_interval_s=3600) as p:
        for i in range(5):
            with p.step(f"run {i}"):
                pass
    assert quiet == ["bench [1] run 0"]  # then at most one line per interval
    screen = io.StringIO()
    with Progress("doctor", 3, tty=True, stream=screen) as p, p.step("torch-cpu-f32"):
        pass
    assert "doctor" in screen.getvalue() and "torch-cpu-f32" in screen.getvalue() and "0/3" in screen.getvalue()
    off: list[str] = []
    with Progress("x", 1, tty=False, emit=off.append, enabled=False) as p, p.step("y"):
        pass
    assert off == []


def test_one_directory_served_twice_under_its_own_names(caplog):
    caplog.set_level(logging.INFO, logger="basal")
    config = parse_config({"models": [{"path": "demo"}, {"path": "demo", "name": "demo-bf16", "dtype": "bf16"}]})
    engines = basal.serve.server.build_engines(config, progress=True)
    assert {n: e.pipeline.backend.dtype for n, e in engines.engines.items()} == {
        "basal-synthetic-demo": "f32",
        "demo-bf16": "bf16",
    }
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loading [")]
    assert steps == [
        "loading [1/4] basal-synthetic-demo: weights, 1 MiB (auto backend)",
        "loading [2/4] basal-synthetic-demo: template prefix on torch cpu",
        "loading [3/4] demo-bf16: weights, 1 MiB (auto backend)",
        "loading [4/4] demo-bf16: template prefix on torch cpu",
    ]
    assert "carry no meaning" in caplog.text
    body = {"model": "demo-bf16", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    with live_server(engines) as url:
        assert [m["name"] for m in httpx.get(f"{url}/v1/models").json()["models"]] == [
            "basal-synthetic-demo",
            "demo-bf16",
        ]
        assert httpx.post(f"{url}/v1/systemone", json=body).json()["model"] == "demo-bf16"


def test_the_loaded_server_freezes_its_start_up_heap_before_it_serves(monkeypatch):
    """`listen` moves the objects of start-up (modules, models, the app) out of the cycle collector's reach before
    uvicorn runs: a full collection over them held the GIL for 130-150 ms (bench/lab/host_ceiling.py)."""
    import gc

    from basal.api.http.listener import DrainingServer
    from basal.core.engine.engines import Engines
    from basal.core.engine.metrics import Metrics
    from basal.serve import server
    from basal.serve.config import ServeConfig

    frozen_when_run = []
    monkeypatch.setattr(DrainingServer, "run", lambda self: frozen_when_run.append(gc.get_freeze_count()))
    gc.unfreeze()  # whatever an earlier test left frozen: none before listen
    try:
        server.listen(Engines({}, "none", Metrics(8), 8), ServeConfig())
    finally:
        gc.unfreeze()
    assert frozen_when_run and frozen_when_run[0] > 10_000


def test_serve_starts_without_cycle_collections_and_leaves_them_on(monkeypatch):
    """The start-up heap grows without collections walking it (freeze_startup_heap turns them on after the load);
    a start that ends early leaves them on too."""
    import gc

    seen: list[bool] = []
    monkeypatch.setattr(basal.serve.server, "serve", lambda config: seen.append(gc.isenabled()))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--addr", f"127.0.0.1:{port}"]) == 0
    assert seen == [False] and gc.isenabled()
