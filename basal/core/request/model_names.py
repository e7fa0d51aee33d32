"""The model names a request may use, and the hint an unknown name gets (docs/http-api.md §4).

A request names a served model, one of the TypeSafe SDK's default names (aliases of the default model), or,
on `/v1/basal`, nothing (the default model). An unknown name is answered with what the server does serve,
so the user can fix the request without a second round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

JEV_ALIASES = ("jev-latest", "jev-preview")  # the TypeSafe SDK's default model names
MAX_NAMES_LISTED = 8  # an error lists at most this many served names (a server may serve many)


@dataclass(frozen=True)
class ServedModels:
    """Requested model name -> served name: a served name, an alias (-> default model), None -> default."""

    names: tuple[str, ...]
    default: str
    aliases: tuple[str, ...] = JEV_ALIASES

    def __call__(self, name: str | None) -> str | None:
        if name is None or name in self.aliases:
            return self.default
        return name if name in self.names else None

    def hint(self) -> str:
        """What an unknown name is told: the served names, the aliases, and where to look them up."""
        shown = ", ".join(self.names[:MAX_NAMES_LISTED])
        if len(self.names) > MAX_NAMES_LISTED:
            shown += f" and {len(self.names) - MAX_NAMES_LISTED} more"
        return f"served: {shown}; aliases {', '.join(self.aliases)} -> {self.default}; GET /v1/models lists them"


def model_resolver(served: Sequence[str], default: str) -> ServedModels:
    """Requested model name -> served name: a served name, a Jev alias (-> default model), None -> default."""
    return ServedModels(tuple(served), default)
