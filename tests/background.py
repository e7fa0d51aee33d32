"""Subprocess tests that take minutes of one core (the Triton interpreter suite, the gpu_check dry run) start in
the background as soon as collection finishes, one after another, and run beside the rest of the suite; their
tests then wait for the result. Only the commands of collected tests start. The verdict is the test's as before:
the test asserts on the exit code and the output."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    timeout: float


@dataclass
class _Run:
    command: Command
    done: threading.Event = field(default_factory=threading.Event)
    result: subprocess.CompletedProcess | None = None
    error: BaseException | None = None


_runs: dict[Callable[[], Command], _Run] = {}
_lock = threading.Lock()
_processes: list[subprocess.Popen] = []


def _run(run: _Run) -> None:
    """Run one command to its end, its output in temporary files (a pipe nobody reads would block the child)."""
    c = run.command
    try:
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            process = subprocess.Popen(c.argv, cwd=c.cwd, env=dict(c.env), stdout=out, stderr=err, text=True)
            _processes.append(process)
            try:
                code = process.wait(timeout=c.timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
                err.write(f"\n[background] killed after {c.timeout:.0f} s\n")
            out.seek(0), err.seek(0)
            run.result = subprocess.CompletedProcess(c.argv, code, out.read(), err.read())
    except BaseException as e:  # surfaced by `result()` in the test that asked for it
        run.error = e
    finally:
        run.done.set()


def start(commands: list[Callable[[], Command]]) -> None:
    """Start `commands` (each a function that builds its Command) one after another on a daemon thread."""
    with _lock:
        fresh = [_runs.setdefault(make, _Run(make())) for make in commands if make not in _runs]

    def chain() -> None:
        for run in fresh:
            _run(run)

    if fresh:
        threading.Thread(target=chain, name="background-tests", daemon=True).start()


def result(make: Callable[[], Command]) -> subprocess.CompletedProcess:
    """The finished command's result; started here if collection did not start it (a test run on its own)."""
    start([make])
    run = _runs[make]
    run.done.wait()
    if run.error is not None:
        raise run.error
    assert run.result is not None
    return run.result


def stop() -> None:
    """Kill what is still running (an interrupted or failed session must not leave interpreters behind)."""
    for process in _processes:
        if process.poll() is None:
            process.kill()


def environment(**changes: str | None) -> tuple[tuple[str, str], ...]:
    """os.environ with `changes` (None removes a variable), frozen for a Command."""
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return tuple(sorted(env.items()))
