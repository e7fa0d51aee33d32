"""One error type for everything a request can get wrong.

The contract layer decides the HTTP status and the exact body of each dialect; the HTTP layer only maps
`RequestError` to a response. Nothing past the contract layer raises for bad input.
"""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A request that cannot be answered: HTTP `status` and the dialect's JSON `body`.

    `upstream` is the error as the upstream reference engine names it (``"ValueError: ..."``), kept so that
    `basal check-reference` can compare with the `upstream_error` of a reference export.
    """

    def __init__(self, status: int, body: Any, upstream: str | None = None):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body
        self.upstream = upstream


class ModelDirError(Exception):
    """A model directory that basal refuses to serve; the message says why and what to do."""
