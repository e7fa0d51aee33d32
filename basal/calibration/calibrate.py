"""CALIBRATION.custom.json from labelled readouts: split by group, fit and cross-validate the temperatures on one
side, certify the thresholds on the other, write the file with its provenance (docs/calibration.md)."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from basal.calibration.certify import LEVEL, Certified, certify
from basal.calibration.collect import Observed
from basal.calibration.fit import Choice, calibrated, choose_temperature, log_loss, logits_matrix
from basal.calibration.labelled import FITTED_TYPES, Labelled, LabelledError
from basal.core.model.model_dir import Calibration

MIN_LINES = 20  # labelled requests: half are held out, and each half needs a few groups
MIN_GROUPS = 4
MIN_PER_TYPE = 10  # questions of a type on the fitting split for its temperature to be fitted


@dataclass(frozen=True)
class Settings:
    targets: tuple[float, ...] = ()  # besides the shipped calibration's own keys
    holdout: float = 0.5  # share of questions (whole groups) kept for certification
    folds: int = 5
    seed: int = 0
    level: float = LEVEL


def split(observed: Sequence[Observed], holdout: float, seed: int) -> np.ndarray:
    """True for the certification side: whole groups in a seeded order until `holdout` of the questions."""
    sizes: dict[str, int] = {}
    for o in observed:
        sizes[o.line.group] = sizes.get(o.line.group, 0) + 1
    names = sorted(sizes)
    order = np.random.default_rng(seed).permutation(len(names))
    chosen, total, goal = set(), 0, holdout * len(observed)
    for j in order:
        if total >= goal:
            break
        chosen.add(names[j])
        total += sizes[names[j]]
    if len(chosen) == len(names):  # both sides need a group
        chosen.discard(names[order[-1]])
    return np.array([o.line.group in chosen for o in observed], dtype=bool)


def check_enough(labelled: Labelled) -> None:
    """Refuse data that cannot give a held-out answer: too few lines or groups, a type with one gold label only."""
    where = labelled.path
    if len(labelled.lines) < MIN_LINES:
        raise LabelledError(
            f"{where}: {len(labelled.lines)} labelled request(s); at least {MIN_LINES} are needed (part of them is "
            "held out to check the fit and certify the thresholds)"
        )
    groups = {line.group for line in labelled.lines}
    if len(groups) < MIN_GROUPS:
        raise LabelledError(f"{where}: {len(groups)} group(s); at least {MIN_GROUPS} are needed to hold some out")
    for t in FITTED_TYPES:
        golds = {r.keys[r.gold] for _, r in labelled.readouts if r.type == t}
        if len(golds) == 1:
            first = next(line for line, r in labelled.readouts if r.type == t)
            raise LabelledError(
                f"{where}: every {t} question's gold is {golds.pop()!r} (first on line {first.number}): a "
                "temperature fitted on one label only says nothing about the others; add questions with other answers"
            )


def _arrays(observed: Sequence[Observed]) -> tuple[np.ndarray, np.ndarray]:
    return logits_matrix([o.p_avg for o in observed]), np.array([o.readout.gold for o in observed], dtype=np.int64)


def _confidence_and_wrong(observed: Sequence[Observed], temps: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """max p_cal (what `act` compares with the threshold) and whether its first maximum is not the gold answer."""
    conf, wrong = np.empty(len(observed)), np.empty(len(observed), dtype=bool)
    for t in {o.readout.type for o in observed}:
        idx = [i for i, o in enumerate(observed) if o.readout.type == t]
        z, gold = _arrays([observed[i] for i in idx])
        p = calibrated(z, temps.get(t, 1.0))
        conf[idx], wrong[idx] = p.max(axis=1), p.argmax(axis=1) != gold
    return conf, wrong


def target_key(target: float) -> str:
    """The key of a target in `thresholds`: Python's str() of the float, as `max_error` looks it up."""
    return str(float(target))


def calibration_document(
    labelled: Labelled,
    observed: Sequence[Observed],
    shipped: Calibration,
    model: dict[str, str],
    settings: Settings,
    version: str,
) -> dict[str, Any]:
    """The CALIBRATION.json schema (temperatures, thresholds) plus `provenance`."""
    check_enough(labelled)
    held = split(observed, settings.holdout, settings.seed)
    fit_side = [o for o, h in zip(observed, held, strict=True) if not h]
    cert_side = [o for o, h in zip(observed, held, strict=True) if h]
    temps = dict(shipped.temperatures)
    per_type: dict[str, Any] = {}
    for t in FITTED_TYPES:
        rows = [o for o in fit_side if o.readout.type == t]
        held_rows = [o for o in cert_side if o.readout.type == t]
        if not rows and not held_rows:
            continue
        before = shipped.temperature(t)
        info: dict[str, Any] = {"shipped": before, "fit_questions": len(rows), "held_out_questions": len(held_rows)}
        if len(rows) < MIN_PER_TYPE:
            info |= {"served": before, "kept": "shipped", "why": f"{len(rows)} questions to fit on (< {MIN_PER_TYPE})"}
        else:
            z, gold = _arrays(rows)
            choice: Choice = choose_temperature(
                z, gold, [o.line.group for o in rows], before, settings.folds, settings.seed
            )
            info |= {
                "fitted": choice.fitted.temperature,
                "fitted_se": choice.fitted.se if np.isfinite(choice.fitted.se) else None,
                "fitted_at_bound": choice.fitted.at_bound,
                "cv_folds": choice.folds,
                "cv_log_loss": {"fitted": choice.cv_log_loss_fitted, "shipped": choice.cv_log_loss_shipped},
                "served": choice.served,
                "kept": "fitted" if choice.improves else "shipped",
                "why": "the fit lowers the cross-validated log-loss"
                if choice.improves
                else "the fit does not lower the cross-validated log-loss: the shipped temperature is kept",
            }
            temps[t] = choice.served
        if held_rows:
            z, gold = _arrays(held_rows)
            info["held_out_log_loss"] = {
                "served": float(log_loss(z, gold, temps.get(t, 1.0)).mean()),
                "shipped": float(log_loss(z, gold, before).mean()),
            }
        per_type[t] = info
    fit_conf, fit_wrong = _confidence_and_wrong(fit_side, temps)
    conf, wrong = _confidence_and_wrong(cert_side, temps)
    wanted = sorted({float(k) for k in shipped.thresholds if _is_number(k)} | set(settings.targets))
    thresholds: dict[str, Any] = {}
    left_out: dict[str, str] = {}
    for target in wanted:
        result = certify(conf, wrong, fit_conf, fit_wrong, target, settings.level)
        if isinstance(result, Certified):
            thresholds[target_key(target)] = result.entry()
        else:
            left_out[target_key(target)] = result.reason
    groups_held = sorted({o.line.group for o in cert_side})
    provenance = {
        "made_by": "basal calibrate",
        "basal_version": version,
        "created": datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        "model": model,
        "data": {
            "file": labelled.path.name,
            "sha256": labelled.sha256,
            "dialect": labelled.dialect,
            "lines": len(labelled.lines),
            "groups": len({line.group for line in labelled.lines}),
            "groups_held_out": len(groups_held),
            "questions": labelled.counts(),
            "fit_questions": _count(fit_side),
            "held_out_questions": _count(cert_side),
        },
        "temperatures": per_type,
        "thresholds": {
            "level": settings.level,
            "method": "fixed-sequence Clopper-Pearson on the held-out groups (docs/calibration.md)",
            "left_out": left_out,
        },
        "settings": {"holdout": settings.holdout, "folds": settings.folds, "seed": settings.seed},
    }
    return {"temperature_per_prim": dict(sorted(temps.items())), "thresholds": thresholds, "provenance": provenance}


def _count(observed: Sequence[Observed]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in observed:
        out[o.readout.type] = out.get(o.readout.type, 0) + 1
    return dict(sorted(out.items()))


def _is_number(key: str) -> bool:
    try:
        return 0 < float(key) < 1
    except ValueError:
        return False


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    """The whole file or nothing: written beside, then renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def summary(document: dict[str, Any]) -> str:
    """What the command prints: each type's temperature and why, each target's threshold or why not."""
    out = []
    for t, info in document["provenance"]["temperatures"].items():
        fitted = f" (fit {info['fitted']:.4f})" if "fitted" in info else ""
        out.append(f"{t}: T = {info['served']:.4f}, {info['kept']}{fitted}: {info['why']}")
    for key, entry in document["thresholds"].items():
        out.append(
            f"max_error {key}: confidence >= {entry['confidence']:.4f} keeps {entry['coverage']:.1%} of held-out "
            f"answers, error bound {entry['error_bound']:.4f} ({entry['errors']}/{entry['kept']} wrong)"
        )
    for key, reason in document["provenance"]["thresholds"]["left_out"].items():
        out.append(f"max_error {key}: left out: {reason}")
    return "\n".join(out)
