"""The locks (lock/*.txt) fit pyproject.toml's ranges: a range changed without `make lock` fails here, offline.
(Whether each install target resolves at all is `make check-install`, which reads the registry.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ["lock/linux-cpu.txt", "lock/linux-cuda.txt"]


def locked(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if (spec := line.split("#")[0].strip()) and "==" in spec:
            name, version = spec.split("==")
            out[canonicalize_name(name)] = version
    return out


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    return [Requirement(s) for s in specs]


def misfits(lock: dict[str, str], requirements: list[Requirement]) -> list[str]:
    return [
        f"{r.name}=={lock[canonicalize_name(r.name)]} is outside {r.specifier}"
        for r in requirements
        if canonicalize_name(r.name) in lock and not r.specifier.contains(lock[canonicalize_name(r.name)], True)
    ]


@pytest.mark.parametrize("lock", LOCKS)
def test_the_lock_fits_the_ranges(lock):
    assert misfits(locked(ROOT / lock), declared()) == []


def test_a_range_the_lock_does_not_fit_is_seen():
    """Negative control: numpy's range moved past the locked version."""
    requirements = [Requirement("numpy>=2.5,<3") if r.name == "numpy" else r for r in declared()]
    assert misfits(locked(ROOT / LOCKS[0]), requirements) == ["numpy==2.4.6 is outside <3,>=2.5"]
