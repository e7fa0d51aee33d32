"""Where basal keeps what it generates (demo models, compiled CPU kernels, probe tables): one folder per user.

Its own module, with no dependencies, so the GPU path imports it on a machine that has only torch and Triton.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$BASAL_HOME, else $XDG_CACHE_HOME/basal, else ~/.cache/basal."""
    if home := os.environ.get("BASAL_HOME"):
        return Path(home).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "basal"
