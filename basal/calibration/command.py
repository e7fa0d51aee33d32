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
        description="Run labelled requests (one /v1/systemone or /v1/basal request per line, a `gold` answer per "
        "question) through the serving path, fit one temperature per question type where it lowers held-out "
        "log-loss, certify max_error thresholds on held-out groups, and write CALIBRATION.custom.json with its "
        "provenance (docs/calibration.md).",
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

    e = sub.add_parser(
        "eval",
        help="accuracy, log-loss, Brier, ECE, reliability and coverage on labelled requests -> a report folder",
        description="Answer labelled requests through the serving path and report accuracy, log-loss, Brier score "
        "and expected calibration error per type and label, a reliability diagram, the accuracy-coverage curve and "
        "confusion matrices (HTML, PNG, JSON, markdown); --against compares another model, calibration or "
        "phrasing; --fail-on exits 2 for CI (docs/calibration.md).",
    )
    _common(e)
    e.add_argument("-o", "--out", required=True, help="the report folder (no default)")
    e.add_argument(
        "--calibration",
        default=None,
        help="a calibration file to evaluate (default: the one `basal serve` would serve for the model)",
    )
    e.add_argument(
        "--against",
        default=None,
        help="compare with: a calibration .json, a model directory, or a .jsonl of rewritten questions (default: none)",
    )
    e.add_argument(
        "--fail-on",
        default="",
        help='exit 2 when any condition holds on the overall metrics, e.g. "ece>0.05,accuracy<0.9" (default: none)',
    )
    e.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of a comparison (default 1000)")
    e.add_argument(
        "--cascade",
        default=None,
        help="evaluate this cascade of --config against each model alone; sweep its threshold (default: none)",
    )
    e.set_defaults(run=_eval)


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
    serve: str | None = None,
):
    """Load the model as `basal serve` would, check the labelled file against its parser, run every line through
    the batch path with diagnostics. `serve`: a served name of the configuration (a model or a cascade; default its
    first model). -> (labelled, observed, model facts, served and shipped calibrations)."""
    from basal.api.decide import body_decider
    from basal.calibration.collect import run_labelled
    from basal.calibration.labelled import read_labelled
    from basal.core.model.model_dir import ModelDir
    from basal.progress import Progress
    from basal.serve.config import DEMO_PATH, ModelConfig, ServeConfig, load_config
    from basal.serve.server import api_settings, load_models, pending_engines, with_cascades

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
    cascades = {c.name: c.steps[0].model for c in config.cascades}
    name = serve or engines.names[0]
    if name not in engines.names and name not in cascades:
        served = ", ".join([*engines.names, *cascades])
        raise ValueError(f"{name!r} is not served by the configuration (it serves: {served})")
    first = cascades.get(name, name)
    labelled = read_labelled(source, a.dialect, name)  # before any weights load
    if check is not None:
        check(labelled)
    load_models(engines, sources, config, progress=not a.quiet)
    info = engines.model_info(first)
    model = engines.engines[first].pipeline.model
    front = with_cascades(engines, config)
    engines.start()
    # diagnostics for the orders' average, without the letter mass (not read): the lines run online's forward path
    decide = body_decider(front, api_settings(config), dialect=a.dialect, diagnostics=True, letter_mass=False)
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
    computed = sum(e.packed_tokens for e in engines.engines.values())
    print(
        f"basal {a.command}: {len(labelled.lines)} request(s), {len(observed)} labelled answers in {seconds:.1f} s "
        f"({computed} tokens computed)",
        file=sys.stderr,
    )
    facts = {"name": name, "version": model.version, "synthetic": model.synthetic, "run_seconds": seconds}
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


def _eval(a: argparse.Namespace) -> int:
    import copy

    from basal.calibration.evaluate import calibrated, compare, evaluate
    from basal.calibration.report import fail_conditions, failed, write_report
    from basal.core.model.model_dir import read_calibration

    conditions = fail_conditions(a.fail_on)  # a typo fails before the model loads
    out = Path(a.out)
    records = Path(a.records) if a.records else out / "records.jsonl"
    if a.cascade:
        return _eval_cascade(a, out, records, conditions)
    labelled, observed, facts, served, _shipped = collect(a, records)
    calibration = read_calibration(Path(a.calibration)) if a.calibration else served
    probs = calibrated(observed, calibration)
    report = evaluate(observed, probs)
    report |= {
        "model": facts,
        "calibration": _described(calibration),
        "data": {"file": labelled.path.name, "sha256": labelled.sha256, "lines": len(labelled.lines)},
        "basal_version": __version__,
    }
    if a.against:
        other = Path(a.against)
        if other.suffix == ".json" and other.is_file():
            b_observed, b_cal, b_name = observed, read_calibration(other), f"calibration {other.name}"
        elif other.suffix == ".jsonl" and other.is_file():
            b_args = copy.copy(a)
            b_args.labelled = str(other)
            _, b_observed, _, b_cal, _ = collect(b_args, out / "records.against.jsonl")
            b_name = f"questions of {other.name}"
        else:
            b_args = copy.copy(a)
            b_args.model, b_args.config = str(other), None
            _, b_observed, b_facts, b_cal, _ = collect(b_args, out / "records.against.jsonl")
            b_name = f"model {b_facts['name']}"
        comparison = compare(observed, probs, b_observed, calibrated(b_observed, b_cal), a.bootstrap)
        report["comparison"] = {"a": f"{calibration.kind} calibration of {facts['name']}", "b": b_name, **comparison}
    for path in write_report(out, report):
        print(path)
    problems = failed(conditions, report["overall"])
    for problem in problems:
        print(f"basal eval: fails: {problem}", file=sys.stderr)
    return 2 if problems else 0


def _eval_cascade(a: argparse.Namespace, out: Path, records: Path, conditions: list) -> int:
    """The cascade's own run (the report's metrics), each model's run alone, and the section comparing them."""
    from basal.calibration.cascade import cascade_section, cost, served
    from basal.calibration.evaluate import evaluate
    from basal.calibration.report import failed, write_report
    from basal.serve.config import load_config

    if not a.config or a.calibration or a.against:
        raise ValueError("--cascade needs --config (the file that defines it) and takes no --calibration or --against")
    config = load_config(a.config)
    found = [c for c in config.cascades if c.name == a.cascade]
    if not found:
        raise ValueError(
            f"--cascade {a.cascade!r}: not in {a.config} (its cascades: "
            f"{', '.join(c.name for c in config.cascades) or 'none'})"
        )
    steps = [
        {"model": s.model, "escalate_below": s.escalate_below, "escalate_above_error": s.escalate_above_error}
        for s in found[0].steps
    ]
    if len(steps) != 2:
        raise ValueError(f"--cascade {a.cascade!r}: the sweep covers two-step cascades; this one has {len(steps)}")
    runs, first = {}, None
    if not a.records:  # the cascade's requests name the cascade only: its steps and rules name its records
        import hashlib

        import msgspec

        digest = hashlib.sha256(msgspec.json.encode(found[0])).hexdigest()[:12]
        records = out / f"records.{a.cascade}.{digest}.jsonl"
    for name, where in [(a.cascade, records), *((s["model"], out / f"records.{s['model']}.jsonl") for s in steps)]:
        resumed = where.exists()
        labelled, observed, facts, _served, _shipped = collect(a, where, serve=name)
        if any(o.readout.type == "multi" for o in observed):
            raise ValueError(
                "--cascade: multi questions are not evaluated yet (a multi escalates on its set's confidence)"
            )
        runs[name] = (observed, cost(observed, labelled, where, None if resumed else facts["run_seconds"]))
        first = first or (labelled, observed, facts)
    labelled, observed, facts = first
    report = evaluate(observed, served(observed))
    report |= {
        "model": facts,
        "calibration": {"kind": "served by each step", "file": None},
        "data": {"file": labelled.path.name, "sha256": labelled.sha256, "lines": len(labelled.lines)},
        "basal_version": __version__,
        "cascade": cascade_section(a.cascade, steps, runs),
    }
    for path in write_report(out, report):
        print(path)
    problems = failed(conditions, report["overall"])
    for problem in problems:
        print(f"basal eval: fails: {problem}", file=sys.stderr)
    return 2 if problems else 0


def _described(calibration) -> dict:
    return {
        "kind": calibration.kind,
        "file": Path(calibration.path).name if calibration.path else None,
        "sha256": calibration.sha256 or None,
        "temperature_per_prim": dict(calibration.temperatures),
    }
