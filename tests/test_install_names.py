"""Every install command in the repository names basal's distribution, `basal-bitwise`: the PyPI name `basal`
belongs to an unrelated project and `basal-engine` to upstream's server, so installing either installs someone else's
package."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = re.compile(
    r"\b(?:pip3?|pipx|uv\s+pip|uv\s+tool)\s+install\b(?P<args>[^`\n;|&)]*)|\buv\s+add\b(?P<add>[^`\n;|&)]*)"
)
# `basal`, upstream's `basal-engine` or `basal-serve`, with extras or a version
WRONG = re.compile(r"basal(?:-engine|-serve)?(?:\[[^\]]*\])?(?:\s*[<>=!~].*)?", re.IGNORECASE)

# Lines of files this branch may not edit (basal/*.py is being moved, README.md rewritten): the lead changes them to
# `basal-bitwise[ray]` on merge and then empties this set. Each must still be an offender, so it cannot go stale.
PENDING: set[tuple[str, str]] = set()


def wrong_names(line: str) -> list[str]:
    """The requirements in `line`'s install commands that name `basal` itself."""
    found = []
    for m in INSTALL.finditer(line):
        args = (m.group("args") or m.group("add") or "").replace("\\", " ")
        try:
            words = shlex.split(args)
        except ValueError:  # an unbalanced quote in prose: split on blanks
            words = args.split()
        found += [w for w in words if not w.startswith("-") and WRONG.fullmatch(w.strip("'\"`"))]
    return found


def repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    return [ROOT / name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def offenders() -> set[tuple[str, str]]:
    out = set()
    for path in repository_files():
        if path == Path(__file__):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for line in text.splitlines():
            if wrong_names(line):
                out.add((path.relative_to(ROOT).as_posix(), line.strip()))
    return out


def test_every_install_command_names_the_distribution():
    found = offenders()
    new = sorted(found - PENDING)
    assert not new, "install basal-bitwise, not basal or basal-engine (other projects' names):\n" + "\n".join(
        f"  {path}: {line}" for path, line in new
    )
    stale = sorted(PENDING - found)
    assert not stale, f"fixed: remove from PENDING {stale}"


@pytest.mark.parametrize(
    "line",
    [
        "python -m pip install basal",
        "pip install 'basal[ray]'",
        "`pip install basal[ray]`",
        "uv pip install --upgrade basal==0.1.0",
        "pip3 install -q basal>=0.1",
        "pipx install basal",
        "uv add basal",
        "RUN pip install --no-cache-dir \\\n basal",
        "pip install 'basal-engine[cuda]'",
        "uv pip install basal-serve==1.5.0",
    ],
)
def test_the_scan_finds_the_wrong_name(line):
    """Negative control: each of these installs the unrelated project."""
    assert wrong_names(line.replace("\\\n", "\\ ")), line


@pytest.mark.parametrize(
    "line",
    [
        "python -m pip install basal-bitwise",
        "pip install 'basal-bitwise[ray]'",
        "pip install -c lock/linux-cpu.txt -e '.[dev]'",
        "pip install basalt",
        "pip install huggingface_hub  # for basal's repo: models",
        "python3 -m pip install torch==2.13.0 && python3 -m pip install .",
    ],
)
def test_the_scan_passes_the_right_names(line):
    assert not wrong_names(line), line


WHEEL = re.compile(r"\b(basal[\w.]*)-(\*|[\d.]+)(?:-py3-none-any)?\.whl")


def wheel_names(text: str) -> list[str]:
    """The distribution part of every basal wheel file name in `text` (`basal_bitwise-0.1.0-py3-none-any.whl`)."""
    return [m.group(1) for m in WHEEL.finditer(text)]


def test_every_wheel_file_name_is_the_distributions():
    """The image's build step and the docs find the wheel `python -m build` makes: its name is the distribution's,
    normalized (`basal_bitwise-*.whl`); a stale one (`basal_engine-*.whl`) finds nothing."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"].replace("-", "_")
    assert wheel_names("ls /tmp/wheel/basal_engine-*.whl") == ["basal_engine"]  # the scan sees a stale name
    found = {}
    for path in repository_files():
        if path.suffix in (".md", ".sh", ".yml", ".yaml", ".toml") or path.name in ("Makefile", "Dockerfile"):
            for wheel in wheel_names(path.read_text(encoding="utf-8", errors="ignore")):
                found.setdefault(wheel, []).append(path.relative_to(ROOT).as_posix())
    assert set(found) == {name}, found
