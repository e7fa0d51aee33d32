"""`basal serve --ray` with a local Ray puts Ray's ports on loopback (Ray's single-node switch, read when ray is
imported); joining a cluster leaves Ray's own network settings alone."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray")

import basal.backends.cuda.cpu.threads as threads
import basal.ray_serve.app as ray_app
from basal.cli import RAY_LOCAL_ONLY, main


@pytest.fixture
def seen(monkeypatch):
    monkeypatch.delenv(RAY_LOCAL_ONLY, raising=False)
    monkeypatch.setattr(threads, "prepare_server_environment", lambda: None)
    calls = []
    monkeypatch.setattr(ray_app, "serve_ray", lambda config: calls.append((config.ray, os.environ.get(RAY_LOCAL_ONLY))))
    return calls


def test_a_local_ray_listens_on_loopback(seen):
    assert main(["serve", "--ray"]) == 0
    ((ray, switch),) = seen
    assert ray.address is None and switch == "0"


def test_joining_a_cluster_leaves_ray_alone(seen):
    assert main(["serve", "--ray", "auto"]) == 0
    ((ray, switch),) = seen
    assert ray.address == "auto" and switch is None


def test_an_operator_choice_is_kept(seen, monkeypatch):
    monkeypatch.setenv(RAY_LOCAL_ONLY, "1")
    assert main(["serve", "--ray"]) == 0
    assert seen[0][1] == "1"
