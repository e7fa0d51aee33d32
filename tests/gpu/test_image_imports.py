"""The GPU path imports only what the GPU machine's image has (tests/gpu/image_guard.py): that image installs
nothing, so one import of msgspec would cost a whole GPU window. The dry run of bench/checks/gpu_check.py runs under the
same guard (test_gpu_check_dry_run.py); this checks the module imports quickly, and that the guard can fail."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.gpu.image_guard import IMAGE_HAS, IMAGE_LACKS

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "tests" / "gpu" / "image_guard.py"
IMPORT_NAME = {"pyyaml": "yaml", "prometheus-client": "prometheus_client"}
LOCK = ROOT / "lock" / "linux-cpu.txt"  # the exact versions make venv installs (pyproject.toml has ranges)


def run_guarded(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "imports.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(GUARD), str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"},
    )  # fmt: skip


def test_every_dependency_is_known_to_be_on_the_image_or_not():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs = project["dependencies"] + extras["ray"] + extras["cuda"] + extras["mlx"]  # what basal/ imports
    names = {re.match(r"[A-Za-z0-9_.-]+", s).group(0).lower() for s in specs}
    unknown = {IMPORT_NAME.get(n, n) for n in names} - IMAGE_HAS - IMAGE_LACKS
    assert not unknown, f"say in tests/gpu/image_guard.py whether the GPU image has {sorted(unknown)}"


def test_the_gpu_path_and_gpu_check_import_only_what_the_image_has(tmp_path):
    done = run_guarded(
        tmp_path,
        "import runpy\n"
        "import basal.backends.cuda.gpu.backend, bench.checks.attention_cases\n"
        "import basal.core.packing.backend, basal.core.packing.tree, basal.core.model.model_dir\n"
        "import basal.backends.load, basal.core.model.synth  # gpu_check's checkpoint, loaded as basal serve does\n"
        f"runpy.run_path({str(ROOT / 'bench' / 'checks' / 'gpu_check.py')!r}, run_name='gpu_check')\n"
        "print('imported')\n",
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]


def test_the_guard_refuses_what_the_image_lacks(tmp_path):
    """Negative control: the answer types need msgspec, which the image does not have."""
    done = run_guarded(tmp_path, "import basal.core.decision.answers\n")
    assert done.returncode != 0
    assert "No module named 'msgspec' on the GPU machine's image" in done.stderr


def test_the_suites_conftest_and_plugins_load_with_the_images_imports():
    """`make gpu-image-check` runs the GPU tests in a venv of the image's versions plus pytest and msgspec: the
    conftest and every plugin it registers must load there (a plugin that reaches Litestar stops that whole run)."""
    code = (
        "import importlib, sys\n"
        "from tests.gpu.image_guard import IMAGE_LACKS, SUITE_ADDS, RefuseMissing\n"
        "sys.meta_path.insert(0, RefuseMissing(IMAGE_LACKS - SUITE_ADDS))\n"
        "import tests.conftest\n"
        "for plugin in tests.conftest.pytest_plugins:\n"
        "    importlib.import_module(plugin)\n"
        "print('loaded')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-3000:]


def image_versions() -> dict[str, str | None]:
    """tests/gpu/image-versions.txt as {import name: pinned version or None}."""
    pins: dict[str, str | None] = {}
    for line in (ROOT / "tests" / "gpu" / "image-versions.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            pins[IMPORT_NAME.get(name.lower(), name.lower())] = version or None
    return pins


def test_the_image_versions_file_lists_only_what_the_image_has():
    pins = image_versions()
    assert {"torch", "triton", "numpy"} <= set(pins) <= IMAGE_HAS


def locked() -> dict[str, str]:
    """lock/linux-cpu.txt as {distribution name: version}."""
    out = {}
    for line in LOCK.read_text().splitlines():
        if (spec := line.split("#")[0].strip()) and "==" in spec:
            name, version = spec.split("==")
            out[name.lower()] = version
    return out


def test_the_locked_triton_is_the_images():
    """The Triton that make test compiles and interprets the kernels with is the one the GPU will run, and the
    [cuda] extra admits it."""
    assert locked()["triton"] == image_versions()["triton"]
    cuda = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cuda"]
    (spec,) = [s.split(";")[0] for s in cuda if s.startswith("triton")]
    low, high = re.fullmatch(r"triton>=([\d.]+),<([\d.]+)", spec).groups()
    version = tuple(map(int, image_versions()["triton"].split(".")))
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split(".")))


def test_the_serve_wheels_carry_what_the_image_lacks_at_basals_pins():
    """`make gpu-wheels` downloads tests/gpu/serve-wheels.txt: every dependency of basal the image lacks (but MLX
    and Ray, which basal serve on a GPU does not import), at the version of the lock (lock/linux-cpu.txt)."""

    def pins(lines) -> dict[str, str]:
        out = {}
        for line in lines:
            spec = line.split(";")[0].strip()
            if spec and not spec.startswith("#") and "==" in spec:
                name, version = spec.split("==")
                out[re.sub(r"\[.*\]", "", name).lower()] = version
        return out

    wheels = pins((ROOT / "tests" / "gpu" / "serve-wheels.txt").read_text().splitlines())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.match(r"[A-Za-z0-9_.-]+", s).group(0).lower() for s in project["dependencies"]}
    basal = {name: version for name, version in locked().items() if name in names}
    lacking = {name for name in basal if IMPORT_NAME.get(name, name) in IMAGE_LACKS - {"mlx", "ray"}}
    assert lacking and lacking <= set(wheels), sorted(lacking - set(wheels))
    assert {name: wheels[name] for name in lacking} == {name: basal[name] for name in lacking}
