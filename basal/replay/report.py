"""A replay's report in a folder: `report.json` (everything), `summary.md` (the headline and the tables),
`report.html` (one self-contained page: plots inline, no network) and a PNG per plot."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from basal.replay.diff import Change, Diff

STATE_CHARS = 300  # of a state shown beside a worst example


def write(out: Path, diff: Diff, a: str, b: str, states: Mapping[str, str], failed: Sequence[str]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    summary = diff.summary()
    worst = [_example(c, states) for c in diff.worst()]
    report = {"a": a, "b": b, "summary": summary, "worst": worst, "unanswered": diff.unanswered, "fail_on": failed}
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(_markdown(report), encoding="utf-8")
    plots = _plots(diff, out)
    (out / "report.html").write_text(_html(report, plots), encoding="utf-8")
    return report


def headline(summary: Mapping[str, Any]) -> str:
    if summary["questions"] and summary["changed"] == 0:
        return f"no differences: all {summary['questions']} answers are bitwise identical"
    return (
        f"{summary['flips']} of {summary['questions']} decisions flip ({summary['flip_rate']:.2%}); "
        f"{summary['changed']} answers changed, max |Δp| {summary['max_abs_dp']:.4g}"
    )


def _example(c: Change, states: Mapping[str, str]) -> dict[str, Any]:
    state = states.get(c.custom_id, "")
    return {
        "custom_id": c.custom_id,
        "question": c.question,
        "type": c.type,
        "a": c.a,
        "b": c.b,
        "flip": c.flip,
        "abs_dp": c.abs_dp,
        "state": state if len(state) <= STATE_CHARS else state[:STATE_CHARS] + "…",
    }


def _markdown(report: Mapping[str, Any]) -> str:
    s = report["summary"]
    lines = [
        "# Replay",
        "",
        f"A: `{report['a']}`  ",
        f"B: `{report['b']}`",
        "",
        f"**{headline(s)}**; {s['requests']} requests, {s['unanswered']} without an answer on a side.",
        "",
        "| type | questions | identical | flips | mean \\|Δp\\| | p99 \\|Δp\\| | max \\|Δp\\| |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, t in s["types"].items():
        lines.append(
            f"| {kind} | {t['questions']} | {t['identical']} | {t['flips']} | {t['mean_abs_dp']:.4g} | "
            f"{t['p99_abs_dp']:.4g} | {t['max_abs_dp']:.4g} |"
        )
    lines += ["", "| question | type | asked | agreement | identical |", "| --- | --- | ---: | ---: | ---: |"]
    for name, q in sorted(s["per_question"].items(), key=lambda kv: kv[1]["agreement"]):
        lines.append(f"| {_cell(name)} | {q['type']} | {q['asked']} | {q['agreement']:.2%} | {q['identical']} |")
    if report["worst"]:
        lines += [
            "",
            "Largest changes:",
            "",
            "| request | question | A | B | \\|Δp\\| |",
            "| --- | --- | --- | --- | ---: |",
        ]
        for w in report["worst"]:
            lines.append(
                f"| {_cell(w['custom_id'])} | {_cell(w['question'])} | {_cell(w['a'])} | {_cell(w['b'])} | "
                f"{w['abs_dp']:.4g} |"
            )
    if report["fail_on"]:
        lines += ["", "**Failed:** " + "; ".join(report["fail_on"])]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _plots(diff: Diff, out: Path) -> dict[str, str]:
    """|Δp| per question type as a histogram: name -> base64 PNG (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    by_type: dict[str, list[float]] = {}
    for c in diff.changes:
        by_type.setdefault(c.type, []).append(c.abs_dp)
    plots = {}
    for kind, values in sorted(by_type.items()):
        fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
        ax.hist(values, bins=40, range=(0.0, max(max(values), 1e-6)), color="#3b6ea8")
        ax.set_title(f"{kind}: |Δp| of the decision ({len(values)} answers)")
        ax.set_xlabel("|p_A − p_B|")
        ax.set_ylabel("answers")
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        (out / f"abs_dp_{kind}.png").write_bytes(buffer.getvalue())
        plots[kind] = base64.b64encode(buffer.getvalue()).decode("ascii")
    return plots


def _html(report: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    e = html.escape
    s = report["summary"]
    verdict = "ok" if not report["fail_on"] else "failed"
    rows = "".join(
        f"<tr><td>{e(k)}</td><td>{t['questions']}</td><td>{t['identical']}</td><td>{t['flips']}</td>"
        f"<td>{t['mean_abs_dp']:.4g}</td><td>{t['p99_abs_dp']:.4g}</td><td>{t['max_abs_dp']:.4g}</td></tr>"
        for k, t in s["types"].items()
    )
    questions = "".join(
        f"<tr><td>{e(n)}</td><td>{e(q['type'])}</td><td>{q['asked']}</td><td>{q['agreement']:.2%}</td>"
        f"<td>{q['identical']}</td></tr>"
        for n, q in sorted(s["per_question"].items(), key=lambda kv: kv[1]["agreement"])
    )
    worst = "".join(
        f"<tr><td>{e(w['custom_id'])}</td><td>{e(w['question'])}</td><td>{e(w['a'])}</td><td>{e(w['b'])}</td>"
        f"<td>{w['abs_dp']:.4g}</td><td class=state>{e(w['state'])}</td></tr>"
        for w in report["worst"]
    )
    figures = "".join(f'<img alt="|Δp| of {e(k)}" src="data:image/png;base64,{v}">' for k, v in plots.items())
    failed = "".join(f"<li>{e(f)}</li>" for f in report["fail_on"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>basal replay</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:right}}td:first-child,th:first-child{{text-align:left}}
.state{{text-align:left;max-width:30em;color:#555}}.ok{{color:#17692c}}.failed{{color:#a11}}img{{margin:.5em}}</style>
</head><body>
<h1>Replay <span class="{verdict}">{verdict}</span></h1>
<p>A: <code>{e(report["a"])}</code><br>B: <code>{e(report["b"])}</code></p>
<p id="headline"><strong>{e(headline(s))}</strong> — {s["requests"]} requests, {s["unanswered"]} without an answer
on a side.</p>
{f"<ul>{failed}</ul>" if failed else ""}
<h2>By question type</h2>
<table><tr><th>type</th><th>questions</th><th>identical</th><th>flips</th><th>mean |Δp|</th><th>p99 |Δp|</th>
<th>max |Δp|</th></tr>{rows}</table>
<div>{figures}</div>
<h2>By question</h2>
<table><tr><th>question</th><th>type</th><th>asked</th><th>agreement</th><th>identical</th></tr>{questions}</table>
<h2>Largest changes</h2>
{
        f"<table><tr><th>request</th><th>question</th><th>A</th><th>B</th><th>|Δp|</th><th>state</th></tr>{worst}</table>"
        if worst
        else "<p>none</p>"
    }
</body></html>
"""
