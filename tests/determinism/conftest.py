from __future__ import annotations

import pytest

from tests.determinism.harness import Harness, available, combo_id

COMBOS = available()


@pytest.fixture(scope="module", params=COMBOS, ids=[combo_id(c) for c in COMBOS])
def harness(request, demo_model) -> Harness:
    backend, device, dtype = request.param
    return Harness(demo_model, backend, device, dtype)


_OUTCOMES: dict[str, list[str]] = {}


def pytest_runtest_logreport(report):
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    label = "negative control" if "negative_control" in report.nodeid else None
    for combo in COMBOS:
        if f"[{combo_id(combo)}" in report.nodeid or f"-{combo_id(combo)}]" in report.nodeid:
            label = label or combo_id(combo)
    if label:
        _OUTCOMES.setdefault(label, []).append(report.outcome)


def pytest_terminal_summary(terminalreporter):
    """One line per backend × dtype, for CI pipelines and `make determinism`."""
    if not _OUTCOMES:
        return
    terminalreporter.section("determinism verdict")
    for label, outcomes in sorted(_OUTCOMES.items()):
        failed = outcomes.count("failed")
        if label == "negative control":
            verdict = "ok: the shape-dependent path was caught" if not failed else "BROKEN: the tests cannot fail"
        else:
            verdict = "bitwise invariant" if not failed else f"NOT INVARIANT ({failed} failing checks)"
        terminalreporter.write_line(f"{label:<22} {len(outcomes):>3} checks  {verdict}")
