"""Is the listening address free? Asked before any model loads, so a busy port costs a second, not a load."""

from __future__ import annotations

import errno
import socket

from basal.serve.config import ConfigError


def check_port(host: str, port: int) -> None:
    """Bind HOST:PORT once and let it go (SO_REUSEADDR, as uvicorn binds: a closed connection's TIME_WAIT is no
    conflict, a listening process is). Port 0 (any free port) needs no check."""
    if port == 0:
        return
    where = f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ConfigError(f"cannot listen on {where}: {host!r} is not a known host ({e.strerror})") from e
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            raise ConfigError(f"cannot listen on {where}: {_advice(e, host, port)}") from e


def _advice(e: OSError, host: str, port: int) -> str:
    if e.errno == errno.EADDRINUSE:
        return (
            f"port {port} is already in use (another basal serve, or another server?). Stop that process "
            f"(`lsof -i :{port}` or `ss -ltnp` names it) or choose another port: --addr {host}:{port + 1} "
            "(or `addr:` in the configuration)"
        )
    if e.errno == errno.EACCES:
        return f"port {port} needs administrator rights here; choose a port above 1023, e.g. --addr {host}:8000"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine; use 127.0.0.1 (this machine only) or 0.0.0.0 (all)"
    return e.strerror or str(e)
