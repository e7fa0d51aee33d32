"""The shipped Prometheus alert rules, checked by Prometheus's own `promtool`: the file parses and every expression
is valid PromQL (`check rules`), and the drift and shadow alerts fire on the series they are meant for, with their
labels and summaries, only once their `for:` has passed (`test rules` on tests/deploy/basal-alerts.test.yml); a
copy with wrong thresholds fails those unit tests. promtool comes from Debian's `prometheus` package (.ci/run
installs it when missing); without it these tests are skipped, saying so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.dashboards import ALERTS

UNIT_TESTS = Path(__file__).with_name("basal-alerts.test.yml")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install --no-install-recommends prometheus)"
)


def _promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_the_alert_rules_pass_promtool_check():
    run = _promtool("check", "rules", ALERTS, cwd=ALERTS.parent)
    rules = sum(len(g["rules"]) for g in yaml.safe_load(ALERTS.read_text())["groups"])
    assert run.returncode == 0 and f"SUCCESS: {rules} rules found" in run.stdout, run.stdout + run.stderr


@needs_promtool
def test_the_drift_and_shadow_alerts_fire_on_their_series():
    run = _promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


@needs_promtool
def test_wrong_thresholds_fail_the_unit_tests(tmp_path):
    """The negative control: each drift and shadow threshold raised past what the unit tests' series reach."""
    rules = ALERTS.read_text()
    wrong = rules.replace(") > 0.2\n", ") > 0.35\n").replace(") > 0.1\n", ") > 0.25\n")
    wrong = wrong.replace(
        "(rate(basal_shadow_decisions_total[30m])) > 0.05", "(rate(basal_shadow_decisions_total[30m])) > 0.15"
    )
    assert wrong.count("0.35") == wrong.count("0.25") == wrong.count("0.15") == 1
    (tmp_path / "deploy/prometheus").mkdir(parents=True)
    (tmp_path / "deploy/prometheus" / ALERTS.name).write_text(wrong)
    (tmp_path / "tests/deploy").mkdir(parents=True)
    shutil.copy(UNIT_TESTS, tmp_path / "tests/deploy")
    run = _promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path / "tests/deploy")
    assert run.returncode != 0, run.stdout
    failed = set(re.findall(r"alertname: (\w+)", run.stdout + run.stderr))
    assert failed == {"BasalDriftLabelShare", "BasalDriftConfidenceDrop", "BasalShadowDisagrees"}, run.stdout


def test_every_drift_and_shadow_alert_has_a_unit_test():
    names = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t.get("exp_alerts")}
    assert {n for n in names if n.startswith(("BasalDrift", "BasalShadow"))} == tested
    assert tests["rule_files"] == [str(Path("../..") / ALERTS.relative_to(ALERTS.parents[2]))]
