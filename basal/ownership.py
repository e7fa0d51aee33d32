"""Is the `basal` package imported here this project's alone?

Upstream's server (`basal-engine`, command `basal`) and PyPI's unrelated `basal` install a package of the same import
name. pip does not refuse that: the later install overwrites the earlier's files, and the mixture fails far from its
cause. The `basal` command checks first and says what to do instead.
"""

from __future__ import annotations

import importlib.metadata as md

import basal

DISTRIBUTION = "basal-bitwise"
# Distributions known to install a top-level `basal` package: upstream's server, its command's name, PyPI's `basal`.
FOREIGN = ("basal-engine", "basal-serve", "basal")
FIX = (
    "they cannot share one environment: install basal-bitwise into a virtual environment of its own "
    "(python3 -m venv .venv; docs/install.md), or `pip uninstall {name}` and then reinstall basal-bitwise"
)


def foreign_installs(names: tuple[str, ...] = FOREIGN) -> list[md.Distribution]:
    """The installed distributions among `names` that put files into a `basal/` package directory."""
    found = []
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        # An editable install of this project under a former name puts no files there; another project's wheel does.
        if any(str(f).startswith("basal/") for f in dist.files or ()):
            found.append(dist)
    return found


def conflict(names: tuple[str, ...] = FOREIGN) -> str | None:
    """What is wrong with the `basal` package here, with what to do, or None when it is this project's alone."""
    if getattr(basal, "__distribution__", None) != DISTRIBUTION:
        return (
            f"the `basal` package at {basal.__file__} is not basal-bitwise's (another project's basal/__init__.py "
            f"replaced it); {FIX.format(name='the other package')}"
        )
    for dist in foreign_installs(names):
        name, version = dist.metadata["Name"], dist.version
        summary = dist.metadata.get("Summary") or "another project"
        return (
            f"{name} {version} ({summary}) is installed in this environment and also writes the `basal` package "
            f"that basal-bitwise imports, so its files and ours are mixed; {FIX.format(name=name)}"
        )
    return None
