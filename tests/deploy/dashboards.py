"""The series the shipped Grafana dashboard and Prometheus alert rules name (read from their PromQL)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/basal-dashboard.json"
ALERTS = ROOT / "deploy/prometheus/basal-alerts.yml"
SERIES = re.compile(r"\b((?:basal|process|python)_[a-z0-9_]+)\b")
SYNTHETIC = {"up"}  # written by Prometheus itself for every scrape, never by a target


def expressions() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    rules = yaml.safe_load(ALERTS.read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return exprs


def dashboard_series() -> set[str]:
    return {name for e in expressions() for name in SERIES.findall(e)} - SYNTHETIC
