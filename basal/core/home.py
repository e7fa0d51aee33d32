"""Where basal keeps what it generates (demo models, compiled CPU kernels, probe tables): one folder per user, and
files there written whole or not at all.

A file is written to a temporary file of the call's own beside the target, then renamed: two processes writing the
same file at once (two servers saving the GEMM table) each rename their own, so the last rename wins and no
reader sees a torn file; a write interrupted midway (an exception, or a signal handler that raises) leaves the old
file as it was and no temporary file behind.

Its own module, with no dependencies, so the GPU path imports it on a machine that has only torch and Triton.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """$BASAL_HOME, else $XDG_CACHE_HOME/basal, else ~/.cache/basal."""
    if home := os.environ.get("BASAL_HOME"):
        return Path(home).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "basal"


def write_text_atomic(path: Path, text: str) -> None:
    """`path` holds `text`, mode 0644 (as a plain write would leave it; mkstemp makes 0600), or is unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
