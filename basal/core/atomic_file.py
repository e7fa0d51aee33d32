"""Files written whole or not at all: a temporary file of the call's own beside the target, then a rename.

Two processes writing the same file at once (two servers saving the GEMM engine table) each rename their own, so
the last rename wins and no reader sees a torn file; a write interrupted midway (an exception, or a signal handler
that raises) leaves the old file as it was and no temporary file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
