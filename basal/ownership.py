"""Is the `basal` package imported here this project's alone?

Upstream's server (`basal-engine`, command `basal`) and PyPI's unrelated `basal` install a package of the same import
name. pip does not refuse that: the later install overwrites the earlier's files, and the mixture fails far from its
cause. The `basal` command checks first and says what to do instead.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import basal

DISTRIBUTION = "basal-bitwise"
# Distributions known to install a top-level `basal` package: upstream's server, its command's name, PyPI's `basal`.
FOREIGN = ("basal-engine", "basal-serve", "basal")
FIX = (
    "they cannot share one environment: install basal-bitwise into a virtual environment of its own "
    "(python3 -m venv .venv; docs/install.md), or `pip uninstall {name}` and then reinstall basal-bitwise"
)


@dataclass(frozen=True)
class Install:
    name: str
    version: str
    summary: str


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _header(metadata: Path, field: str) -> str:
    try:
        with metadata.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the body starts
                if line.lower().startswith(f"{field.lower()}:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def foreign_installs(names: tuple[str, ...] = FOREIGN) -> list[Install]:
    """The installed distributions among `names` that put files into a `basal/` package directory.

    Read from the `*.dist-info` folders on sys.path directly: importlib.metadata reads every distribution's
    metadata, a tenth of a second at each start of the command."""
    wanted = {_normal(n) for n in names}
    found = []
    for entry in dict.fromkeys(sys.path):
        try:
            children = os.listdir(entry or ".")
        except OSError:
            continue
        for child in children:
            name, _, version = child.removesuffix(".dist-info").rpartition("-")
            if not child.endswith(".dist-info") or _normal(name) not in wanted:
                continue
            info = Path(entry or ".") / child
            try:
                record = (info / "RECORD").read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            # An editable install of this project under a former name puts no files there; another project's does.
            if any(line.startswith("basal/") for line in record.splitlines()):
                metadata = info / "METADATA"
                found.append(Install(_header(metadata, "Name") or name, version, _header(metadata, "Summary")))
    return found


def conflict(names: tuple[str, ...] = FOREIGN) -> str | None:
    """What is wrong with the `basal` package here, with what to do, or None when it is this project's alone."""
    if getattr(basal, "__distribution__", None) != DISTRIBUTION:
        return (
            f"the `basal` package at {basal.__file__} is not basal-bitwise's (another project's basal/__init__.py "
            f"replaced it); {FIX.format(name='the other package')}"
        )
    for dist in foreign_installs(names):
        return (
            f"{dist.name} {dist.version} ({dist.summary or 'another project'}) is installed in this environment and "
            f"also writes the `basal` package that basal-bitwise imports, so its files and ours are mixed; "
            f"{FIX.format(name=dist.name)}"
        )
    return None
