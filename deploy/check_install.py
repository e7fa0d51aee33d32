"""Resolve basal's dependencies for each install target from the registry's metadata, installing nothing.

    python deploy/check_install.py                        # every target; exit 1 on a conflict or a wrong set
    python deploy/check_install.py --pyproject lock/negative/pyproject.toml --expect-conflict linux-cuda-2.13

`uv pip compile --python-platform` reads each wheel's metadata as the registry serves it, so the torch it resolves
on Linux is PyPI's CUDA build, with the Triton that build pins (torch 2.13.0: triton 3.7.1). A CPU build of torch
declares no Triton, which is why installing on a CPU machine never showed the conflict of issue 27. The Linux CPU
target reads the CPU build's metadata from `--torch-find-links` (a folder with its wheel) or `--torch-index`.
With `--expect-conflict NAME` the run is a negative control: it passes only if target NAME fails to resolve.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    name: str
    python: str  # the Python version the target runs
    platform: str  # uv's --python-platform
    extras: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()  # what the target's installer fixes first (its torch build)
    must_have: dict[str, str | None] = field(default_factory=dict)  # name -> exact version, or None for any
    must_lack: tuple[str, ...] = ()  # names, or prefixes ending in "-"
    cpu_torch: bool = False  # resolve torch from the CPU build's metadata (--torch-find-links / --torch-index)
    macos: str = ""  # the oldest macOS it runs (MLX's wheels start at 14.0)


TARGETS = (
    Target(
        "linux-cuda-2.13", "3.12", "x86_64-manylinux_2_28", ("cuda",), ("torch==2.13.0",),
        must_have={"torch": "2.13.0", "triton": "3.7.1", "nvidia-cublas": None},
    ),
    Target(  # the GPU image's torch (tests/gpu/image-versions.txt)
        "linux-cuda-2.11", "3.12", "x86_64-manylinux_2_28", ("cuda",), ("torch==2.11.0",),
        must_have={"torch": "2.11.0", "triton": "3.6.0"},
    ),
    Target(  # the default on Apple Silicon: MLX, and no torch
        "macos-arm64", "3.12", "aarch64-apple-darwin", must_have={"mlx": None}, must_lack=("torch", "triton"),
        macos="14.0",
    ),
    Target(  # the default on Linux without a GPU: the CPU build of torch, no Triton, no MLX, no CUDA libraries
        "linux-cpu", "3.11", "x86_64-manylinux_2_36", pins=("torch==2.13.0+cpu",), cpu_torch=True,
        must_have={"torch": "2.13.0+cpu"}, must_lack=("triton", "mlx", "nvidia-"),
    ),
)  # fmt: skip


def uv_binary() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            sys.exit("check_install: needs uv (in basal's dev extra: make venv)")
        return found


def resolve(target: Target, pyproject: Path, args: argparse.Namespace, scratch: Path) -> tuple[bool, str]:
    """(resolved, uv's output): the pinned set on success, the conflict's explanation otherwise."""
    declared = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    extras = [e for e in target.extras if e in declared]  # the old pyproject has no [cuda]: its defaults, then
    pins = scratch / f"{target.name}.in"
    pins.write_text("".join(f"{p}\n" for p in target.pins))
    command = [
        uv_binary(), "pip", "compile", str(pyproject), str(pins), "--python-version", target.python,
        "--python-platform", target.platform, "--no-header", "--no-annotate", "--quiet", "--no-config",
        *[a for e in extras for a in ("--extra", e)],
    ]  # fmt: skip
    if target.cpu_torch:
        if args.torch_find_links:
            command += ["--find-links", args.torch_find_links]
        elif args.torch_index:
            command += ["--index", args.torch_index, "--index-strategy", "unsafe-best-match"]
        else:
            return False, "needs the CPU build of torch's metadata: --torch-find-links DIR or --torch-index URL"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    if target.macos:
        env["MACOSX_DEPLOYMENT_TARGET"] = target.macos
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    return done.returncode == 0, (done.stdout if done.returncode == 0 else done.stderr).strip()


def pinned(output: str) -> dict[str, str]:
    out = {}
    for line in output.splitlines():
        if m := re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", line.strip()):
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return out


def wrong(target: Target, versions: dict[str, str]) -> list[str]:
    problems = []
    for name, version in target.must_have.items():
        if name not in versions:
            problems.append(f"{name} is missing")
        elif version is not None and versions[name] != version:
            problems.append(f"{name}=={versions[name]}, expected {version}")
    for name in target.must_lack:
        hits = [n for n in versions if (n.startswith(name) if name.endswith("-") else n == name)]
        problems += [f"{n} should not be installed" for n in hits]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--only", action="append", choices=[t.name for t in TARGETS], help="these targets only")
    parser.add_argument("--expect-conflict", metavar="TARGET", choices=[t.name for t in TARGETS])
    parser.add_argument("--torch-find-links", help="a folder with the CPU build of torch 2.13.0's wheel")
    parser.add_argument("--torch-index", help="an index that serves the CPU build of torch (PyTorch's CPU index)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    targets = [t for t in TARGETS if t.name in (args.only or [t.name for t in TARGETS])]
    if args.expect_conflict:
        targets = [t for t in TARGETS if t.name == args.expect_conflict]

    failed = []
    with tempfile.TemporaryDirectory() as scratch:
        for target in targets:
            ok, output = resolve(target, args.pyproject.resolve(), args, Path(scratch))
            versions = pinned(output) if ok else {}
            problems = wrong(target, versions) if ok else [output]
            shown = {n: versions[n] for n in ("torch", "triton", "mlx") if n in versions}
            verdict = "resolves" if ok and not problems else ("wrong set" if ok else "CONFLICT")
            print(f"{target.name:16} {verdict:9} {len(versions):3} packages  {shown}", flush=True)
            for problem in problems:
                print("    " + problem.replace("\n", "\n    "), flush=True)
            if problems:
                failed.append(target.name)
    if args.expect_conflict:
        if failed:
            print(f"negative control: {args.pyproject.name} does not resolve for {args.expect_conflict}, as expected")
            return 0
        print(f"negative control FAILED: {args.expect_conflict} resolved with {args.pyproject}")
        return 1
    print("every target resolves" if not failed else f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
