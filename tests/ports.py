"""A free TCP port on loopback, with the standard library only: tests/postgres.py is a plugin of every pytest run,
the GPU image's included (`make gpu-image-check`), where the HTTP stack in tests/servers.py cannot import."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS's pick; a server started soon after may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
