"""The CPU forward's threads: physical cores by default, a configured count wins, bad values are refused."""

from __future__ import annotations

import os

import pytest
import torch

from basal.backends.cuda.cpu import threads as T
from basal.serve.config import ConfigError, parse_config


def test_physical_cores_are_at_most_the_usable_cpus():
    assert 1 <= T.physical_cores() <= len(os.sched_getaffinity(0))


def test_configured_count_wins_and_sticks(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(T, "_configured", None)
    try:
        assert T.configure_threads(1) == 1 and torch.get_num_threads() == 1
        assert T.configure_threads() == 1  # a later default keeps the first choice
        monkeypatch.setattr(T, "_configured", None)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert T.configure_threads() == T.physical_cores()
    finally:
        torch.set_num_threads(before)


def test_config_threads_key():
    assert parse_config({"threads": 3}).threads == 3
    with pytest.raises(ConfigError, match="threads"):
        parse_config({"threads": 0})


def test_server_environment_keeps_what_is_set(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    T.prepare_server_environment()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and os.environ["TOKENIZERS_PARALLELISM"] == "false"
