"""A changed calibration served without a restart: on SIGHUP every model's calibration file is read again
(the configured `calibration:`, else CALIBRATION.custom.json beside the model, else CALIBRATION.json).

The swap is one attribute assignment on the model's pipeline: a request already answering keeps the calibration it
started its answer with, later ones get the new file; nothing is dropped or queued. A file that cannot be read or
checked leaves the served one in place (logged as an error)."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Mapping

from basal.core.engine.engines import Engines
from basal.core.errors import ModelDirError
from basal.core.model.model_dir import served_calibration
from basal.serve.config import ModelConfig

log = logging.getLogger("basal")


def reload_calibrations(
    engines: Engines, specs: Mapping[str, ModelConfig], on_change: Callable[[], None] = lambda: None
) -> dict[str, str]:
    """Re-read each loaded model's calibration; -> model name: what happened (changed, unchanged, or the error).
    `on_change`: called once after any calibration changed (the answer cache forgets what the old one answered)."""
    outcome = {}
    for name, engine in list(engines.engines.items()):
        pipeline = engine.pipeline
        old = pipeline.model.calibration
        spec = specs.get(name)
        try:
            new = served_calibration(pipeline.model.path, spec.calibration if spec else None)
        except ModelDirError as e:
            log.error("%s: calibration not reloaded, still serving %s: %s", name, old.path or "none", e)
            outcome[name] = f"error: {e}"
            continue
        if (new.path, new.sha256) == (old.path, old.sha256):
            outcome[name] = "unchanged"
            continue
        pipeline.model = dataclasses.replace(pipeline.model, calibration=new)
        log.info("%s: now serving the %s calibration %s (sha256 %s)", name, new.kind, new.path or "-", new.sha256[:12])
        outcome[name] = "changed"
    if "changed" in outcome.values():
        on_change()
    return outcome


def reload_on_sighup(
    engines: Engines, specs: Mapping[str, ModelConfig], on_change: Callable[[], None] = lambda: None
) -> None:
    """SIGHUP -> `reload_calibrations` on a thread of its own (the signal handler returns at once). Only the main
    thread may install a handler: a server started on another thread (an embedding program, the tests) says so
    in its log and reloads nothing."""

    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(
            target=reload_calibrations, args=(engines, specs, on_change), name="basal-reload", daemon=True
        ).start()

    if threading.current_thread() is not threading.main_thread():
        log.info("not on the main thread: SIGHUP does not reload calibrations in this server")
        return
    signal.signal(signal.SIGHUP, handler)
