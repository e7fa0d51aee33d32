"""The benchmark scripts users are told to run still run (on the smallest settings)."""

from __future__ import annotations

import sys

from bench import mac_check


def test_mac_check_smoke_on_cpu(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mac_check", "--device", "cpu", "--preset", "demo", "--runs", "2"])
    mac_check.main()
    out = capsys.readouterr().out
    assert "DIFFERENT" not in out and out.count(" ok") == 12
    assert "same decisions: True" in out and "decisions/s" in out
