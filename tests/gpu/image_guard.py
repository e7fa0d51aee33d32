"""Run a script as the GPU machine's image would import it: `python tests/gpu/image_guard.py SCRIPT ARGS...`.

The image has its own torch and Triton and installs nothing (docs/gpu-path.md §8.2), and it lacks some of basal's
dependencies (msgspec, Litestar, ...). bench/checks/gpu_check.py and the GPU path must import none of those, or the
first GPU window is spent on an ImportError. This runs SCRIPT with those imports refused.
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys

# import names of basal's dependencies (pyproject.toml) by whether the GPU machine's image has them
IMAGE_HAS = {"numpy", "tokenizers", "safetensors", "yaml", "tqdm", "uvloop", "torch", "triton"}
IMAGE_LACKS = {
    "msgspec",
    "litestar",
    "uvicorn",
    "httptools",
    "zstandard",
    "mlx",
    "ray",
    "prometheus_client",
    "opentelemetry",
}
REFUSED = IMAGE_LACKS | {"tests"}  # the test suite is not part of what the GPU path may need
# what `make gpu-image-check` adds to the image's imports to run the GPU tests there (with pytest): the conftest's
SUITE_ADDS = {"msgspec"}


class RefuseMissing(importlib.abc.MetaPathFinder):
    def __init__(self, refused: set[str] = REFUSED):
        self.refused = refused

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.refused:
            raise ModuleNotFoundError(f"No module named {name!r} on the GPU machine's image", name=name)
        return None


def main() -> None:
    sys.meta_path.insert(0, RefuseMissing())
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
