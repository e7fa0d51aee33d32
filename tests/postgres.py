"""A real PostgreSQL server for the tests (no mock, no shared service): Debian's `postgresql` binaries, `initdb`
into a temporary directory, a free port on 127.0.0.1, stopped when the session ends.

`initdb` refuses to run as root, so as root the server runs as `nobody` (through `runuser`, else `setpriv`),
its directory owned by that user. Where the binaries are not installed (`apt-get install postgresql`; `.ci/run`
installs them) the tests that need the server are skipped, saying so. The server runs with `fsync=off`: a
test's database need not survive a power cut, and the tests' speed depends on it.

Fixtures (registered in tests/conftest.py): `postgres` (the session's server) and `database` (each test
parametrised over the two stores: None for SQLite, a fresh database's URL for PostgreSQL).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.ports import free_port

KINDS = ("sqlite", "postgresql")
USER = "nobody"  # who runs the server when the tests run as root


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory holding `initdb` and `pg_ctl`, or None."""
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if (Path(p) / "initdb").exists()]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", USER, "--", *argv]
    return ["setpriv", f"--reuid={USER}", f"--regid={pwd.getpwnam(USER).pw_gid}", "--clear-groups", *argv]


class Postgres:
    """One PostgreSQL cluster in a temporary directory: started, stopped, restarted, and fresh databases."""

    def __init__(self, bindir: Path, durable: bool = False):
        self.bindir, self.durable = bindir, durable  # durable: fsync on, as a production server (benchmarks)
        self.dir = Path(tempfile.mkdtemp(prefix="basal-pg-"))  # not under pytest's 0700 tmp: the server user reads it
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self.port = free_port()
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            _as_server_user([str(self.bindir / tool), *args]), capture_output=True, text=True, timeout=120
        )
        if done.returncode:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}\n{log}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database's URL (each test its own: no test sees another's batches)."""
        import psycopg

        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """The session's PostgreSQL server (skipped, saying why, where its binaries or psycopg are missing)."""
    bindir = binaries()
    if bindir is None:
        pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql")
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed: pip install 'basal-bitwise[postgres]'")
    server = Postgres(bindir)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop("immediate")
        finally:
            server.remove()


def database_for(kind: str, request: pytest.FixtureRequest) -> str | None:
    """None for SQLite; for PostgreSQL a fresh database on the session's server."""
    if kind == "sqlite":
        return None
    return request.getfixturevalue("postgres").new_database()


@pytest.fixture(params=KINDS)
def database(request) -> str | None:
    """Each test once per store: None (SQLite under the test's directory) and a fresh PostgreSQL database."""
    return database_for(request.param, request)


def wait_for(check, timeout: float = 60.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
