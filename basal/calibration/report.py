"""`basal eval`'s report folder: report.json (every number), summary.md, one PNG per plot and report.html, which
holds the same plots inline (base64 PNG) and loads nothing from the network."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any

PLOT_DPI = 100
CONDITION = re.compile(r"\s*(accuracy|log_loss|log-loss|brier|ece)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*")


def fail_conditions(spec: str) -> list[tuple[str, str, float]]:
    """`"ece>0.05,accuracy<0.9"` -> [(metric, operator, value)]; ValueError naming a part that is not one."""
    out = []
    for part in spec.split(","):
        if not part.strip():
            continue
        m = CONDITION.fullmatch(part)
        if not m:
            raise ValueError(
                f"--fail-on: {part.strip()!r} is not METRIC OP NUMBER (metrics: accuracy, log_loss, brier, ece; "
                "operators: < > <= >=)"
            )
        out.append((m.group(1).replace("-", "_"), m.group(2), float(m.group(3))))
    return out


def failed(conditions: list[tuple[str, str, float]], overall: dict[str, float]) -> list[str]:
    """The conditions that hold on the overall metrics (each one a reason to fail the CI job)."""
    ops = {"<": float.__lt__, ">": float.__gt__, "<=": float.__le__, ">=": float.__ge__}
    return [
        f"{name} = {overall[name]:.4f} {op} {value}"
        for name, op, value in conditions
        if ops[op](float(overall[name]), value)
    ]


def clean(value: Any) -> Any:
    """JSON has no NaN: an undefined metric (a label never decided has no precision) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PLOT_DPI, bbox_inches="tight")
    return buffer.getvalue()


def plots(report: dict[str, Any]) -> dict[str, bytes]:
    """File name -> PNG bytes: the reliability diagram, the accuracy–coverage curve, a confusion matrix per choice
    question (matplotlib without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out = {}
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="#999", linestyle="--", linewidth=1, label="perfect calibration")
    for name, bins in report["reliability"].items():
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o", label=name)
    ax.set(xlabel="confidence (mean of the bin)", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.02))
    ax.set_title("Reliability (equal-mass bins)")
    ax.legend(loc="lower right", fontsize=8)
    out["reliability.png"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, curve in report["coverage"].items():
        ax.plot([p["coverage"] for p in curve], [p["accuracy"] for p in curve], label=name)
    ax.set(xlabel="coverage (share of answers kept, most confident first)", ylabel="accuracy of those kept")
    ax.set_xlim(0, 1)
    ax.set_title("Accuracy against coverage")
    ax.legend(loc="lower left", fontsize=8)
    out["coverage.png"] = _png(fig)
    plt.close(fig)

    for i, (name, c) in enumerate(report["confusion"].items()):
        k = len(c["keys"])
        fig, ax = plt.subplots(figsize=(1.2 + 0.6 * k, 1.0 + 0.6 * k))
        ax.imshow(c["matrix"], cmap="Blues")
        ax.set_xticks(range(k), c["keys"], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(k), c["keys"], fontsize=8)
        for r, row in enumerate(c["matrix"]):
            for col, v in enumerate(row):
                ax.text(col, r, str(v), ha="center", va="center", fontsize=8)
        ax.set(xlabel="decided", ylabel="gold")
        ax.set_title(name, fontsize=9)
        out[f"confusion-{i + 1}.png"] = _png(fig)
        plt.close(fig)
    if "cascade" in report:
        out["cascade.png"] = _cascade_plot(report["cascade"], plt)
    return out


def _cascade_plot(c: dict[str, Any], plt) -> bytes:
    """Accuracy against the share escalated as the first step's threshold sweeps; the Pareto points marked."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([p["escalated"] for p in c["sweep"]], [p["accuracy"] for p in c["sweep"]], color="#888", label="sweep")
    front = c["pareto"]
    ax.plot([p["escalated"] for p in front], [p["accuracy"] for p in front], "o", label="Pareto points")
    served = c["rows"][c["name"]]
    ax.plot(
        [c["answered"].get(c["steps"][1]["model"], 0.0)],
        [served["accuracy"]],
        "*",
        markersize=12,
        label=f"{c['name']} as configured",
    )
    ax.set(xlabel=f"share escalated to {c['steps'][1]['model']} (0: {c['steps'][0]['model']} alone)", ylabel="accuracy")
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(f"Cascade {c['name']}: accuracy against escalation")
    ax.legend(loc="lower right", fontsize=8)
    data = _png(fig)
    plt.close(fig)
    return data


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def _table(rows: dict[str, dict[str, Any]], columns: list[str], first: str) -> list[list[str]]:
    return [[first, *columns]] + [[name, *(_fmt(r.get(c, "")) for c in columns)] for name, r in rows.items()]


def _md(table: list[list[str]]) -> str:
    head, *rows = table
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _html_table(table: list[list[str]]) -> str:
    head, *rows = table
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


METRIC_COLUMNS = ["count", "accuracy", "log_loss", "brier", "ece"]
LABEL_COLUMNS = ["offered", "support", "recall", "precision", "ece", "brier"]
COMPARE_COLUMNS = ["a", "b", "delta", "low", "high"]
COST_COLUMNS = ["tokens_per_decision", "seconds_per_decision"]
SWEEP_COLUMNS = ["threshold", "escalated", "accuracy", *COST_COLUMNS]


def _sections(report: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    out = [
        ("Overall", _table({"all": report["overall"]}, METRIC_COLUMNS, "")),
        ("Per question type", _table(report["by_type"], METRIC_COLUMNS, "type")),
        ("Per label (one against the rest)", _table(report["by_label"], LABEL_COLUMNS, "label")),
    ]
    if "comparison" in report:
        c = report["comparison"]
        out.append((f"Paired comparison: b = {c['b']} against a = {c['a']}", _table(c["metrics"], COMPARE_COLUMNS, "")))
        flips = [["line", "id", "question", "gold", "a", "b"]] + [
            [str(f["line"]), f["id"], f["question"], f["gold"], f["a"], f["b"]] for f in c["flips"]
        ]
        out.append((f"Decisions that flip ({len(c['flips'])} of {c['paired']})", flips))
    if "cascade" in report:
        out += _cascade_sections(report["cascade"])
    return out


def _cascade_sections(c: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    rules = ", ".join(
        f"{s['model']} (escalate below {s['escalate_below']})"
        if s["escalate_below"] is not None
        else f"{s['model']} (escalate above error {s['escalate_above_error']})"
        if s["escalate_above_error"] is not None
        else s["model"]
        for s in c["steps"]
    )
    answered = [["model", "share answered"]] + [[m, _fmt(v)] for m, v in c["answered"].items()]
    pareto = {str(i + 1): p for i, p in enumerate(c["pareto"])}
    return [
        (
            f"Cascade {c['name']} against each model alone: {rules}",
            _table(c["rows"], METRIC_COLUMNS + COST_COLUMNS, ""),
        ),
        (f"Questions each step answered in {c['name']}", answered),
        (
            "Suggested thresholds for the first step: Pareto points of accuracy against escalation (cost estimated "
            "from each model alone)",
            _table(pareto, SWEEP_COLUMNS, ""),
        ),
    ]


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# basal eval: {report['model']['name']} on {report['data']['file']}", "", _headline(report), ""]
    for title, table in _sections(report):
        lines += [f"## {title}", "", _md(table), ""]
    plots = "reliability.png, coverage.png, confusion-*.png" + (", cascade.png" if "cascade" in report else "")
    lines += [f"Plots: {plots}; every number in report.json.", ""]
    return "\n".join(lines)


def _headline(report: dict[str, Any]) -> str:
    o = report["overall"]
    c = report["calibration"]
    return (
        f"{o['count']} labelled answers; accuracy {o['accuracy']:.1%}, log-loss {o['log_loss']:.4f}, "
        f"Brier {o['brier']:.4f}, ECE {o['ece']:.4f} — calibration: {c['kind']} ({c['file'] or 'T = 1'})."
    )


def html_page(report: dict[str, Any], images: dict[str, bytes]) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>basal eval: {html.escape(report['model']['name'])}</title>",
        "<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;"
        "margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%;margin:.5em 1em .5em 0}</style>",
        "</head><body>",
        f"<h1>basal eval: {html.escape(report['model']['name'])} on {html.escape(report['data']['file'])}</h1>",
        f"<p id='headline'>{html.escape(_headline(report))}</p>",
    ]
    for title, table in _sections(report):
        parts += [f"<h2>{html.escape(title)}</h2>", _html_table(table)]
    parts.append("<h2>Plots</h2>")
    for name, png in images.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>")
    parts.append(
        "<script type='application/json' id='report'>"
        + json.dumps(clean(report), allow_nan=False).replace("</", "<\\/")
        + "</script></body></html>"
    )
    return "".join(parts)


def write_report(folder: Path, report: dict[str, Any]) -> list[Path]:
    """Every file of the report; each written whole (written beside, then renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    images = plots(report)
    files: dict[str, bytes] = {
        "report.json": (json.dumps(clean(report), indent=2, allow_nan=False) + "\n").encode(),
        "summary.md": markdown(report).encode(),
        "report.html": html_page(report, images).encode(),
        **images,
    }
    written = []
    for name, data in files.items():
        partial = folder / f".{name}.partial"
        partial.write_bytes(data)
        partial.replace(folder / name)
        written.append(folder / name)
    return written
