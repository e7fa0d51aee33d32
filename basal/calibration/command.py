"""`basal calibrate` and `basal eval`: their flags, and the run of a labelled file through the serving path."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from basal import __version__

if TYPE_CHECKING:
    from basal.calibration.labelled import Labelled


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "calibrate",
        help="fit temperatures and certify max_error thresholds on labelled requests -> CALIBRATION.custom.json",
    )
    _common(c)
    c.add_argument(
        "-o", "--out", required=True, help="the file to write (no default; e.g. MODEL/CALIBRATION.custom.json)"
    )
    c.add_argument(
        "--targets",
        default="",
        help="comma-separated target errors to certify besides the model's own (default: none; e.g. 0.02,0.1)",
    )
    c.add_argument(
        "--holdout", type=float, default=0.5, help="share of questions (whole groups) held out (default 0.5)"
    )
    c.add_argument("--folds", type=int, default=5, help="cross-validation folds for keeping a fit (default 5)")
    c.add_argument("--seed", type=int, default=0, help="seed of the group split and the folds (default 0)")
    c.set_defaults(run=_calibrate)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("labelled", help="JSONL: one request per line, each question with its gold answer")
    p.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    p.add_argument("--config", default=None, help="a `basal serve` YAML file; its first model (default: none)")
    p.add_argument(
        "--dialect",
        default="systemone",
        choices=["systemone", "basal"],
        help="the dialect of every line (default systemone, as upstream's labelled files)",
    )
    p.add_argument(
        "--records", default=None, help="answers kept as they come; a run resumes (default: beside the output)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def collect(
    a: argparse.Namespace,
    records: Path,
    calibration: str | None = None,
    check: Callable[[Labelled], None] | None = None,
):
    """Load the model as `basal serve` would, check the labelled file against its parser, run every line through
    the batch path with diagnostics. -> (labelled, observed, model facts, served and shipped calibrations)."""
    from basal.api.decisions import body_decider
    from basal.calibration.collect import run_labelled
    from basal.calibration.labelled import read_labelled
    from basal.core.model.model_dir import ModelDir
    from basal.progress import Progress
    from basal.serve.config import DEMO_PATH, ModelConfig, ServeConfig, load_config
    from basal.serve.server import api_settings, load_models, pending_engines

    source = Path(a.labelled)
    if not source.is_file():
        raise ValueError(f"{source}: no such labelled file")
    config = load_config(a.config) if a.config else ServeConfig(models=[ModelConfig(path=a.model or DEMO_PATH)])
    if calibration is not None:
        import msgspec

        config = msgspec.structs.replace(
            config, models=[msgspec.structs.replace(config.models[0], calibration=calibration)]
        )
    engines, sources = pending_engines(config)
    name = engines.names[0]
    labelled = read_labelled(source, a.dialect, name)  # before any weights load
    if check is not None:
        check(labelled)
    load_models(engines, sources, config, progress=not a.quiet)
    info = engines.model_info(name)
    model = engines.engines[name].pipeline.model
    engines.start()
    decide = body_decider(engines, api_settings(config), a.dialect, diagnostics=True)
    shown: list[Progress] = []

    def before(todo: int, done: int) -> None:
        if done:
            print(f"basal {a.command}: {done} request(s) already answered in {records}", file=sys.stderr)
        shown.append(Progress(a.command, todo, min_interval_s=5.0, enabled=not a.quiet))

    def on_record(key: str, ok: bool) -> None:
        with shown[0].step(key[:12]):
            pass

    started = time.perf_counter()
    try:
        observed = asyncio.run(run_labelled(labelled, decide, records, before, on_record))
    finally:
        for bar in shown:
            bar.close()
        engines.close(drain=False)
    seconds = time.perf_counter() - started
    print(
        f"basal {a.command}: {len(labelled.lines)} request(s), {len(observed)} labelled answers in {seconds:.1f} s",
        file=sys.stderr,
    )
    facts = {"name": name, "version": model.version, "synthetic": model.synthetic}
    return labelled, observed, facts, info.calibration, ModelDir.load(model.path).calibration


def _calibrate(a: argparse.Namespace) -> int:
    from basal.calibration.calibrate import (
        Settings,
        calibration_document,
        check_enough,
        summary,
        write_atomically,
    )

    out = Path(a.out)
    targets = tuple(float(t) for t in a.targets.split(",") if t.strip())
    if any(not 0 < t < 1 for t in targets):
        raise ValueError(f"--targets must be error rates between 0 and 1, got {a.targets!r}")
    if not 0 < a.holdout < 1:
        raise ValueError("--holdout must be between 0 and 1")
    records = Path(a.records) if a.records else out.with_name(out.name + ".records.jsonl")
    labelled, observed, facts, _served, shipped = collect(a, records, check=check_enough)
    facts["calibration_sha256"] = shipped.sha256
    document = calibration_document(
        labelled, observed, shipped, facts, Settings(targets, a.holdout, a.folds, a.seed), __version__
    )
    write_atomically(out, document)
    print(summary(document))
    print(f"basal calibrate: wrote {out}", file=sys.stderr)
    return 0
