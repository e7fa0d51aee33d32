"""`--model owner/name[@revision]` and `basal download` against a Hugging Face cache built here (HF_HOME in a temporary
folder, laid out as the hub lays it out: blobs, snapshots/<commit> of links, refs/<branch>), with no network: a guard
fails every connection that is not to loopback. The hub's own client (huggingface_hub, offline) and basal's reader
of the cache (without huggingface_hub) both serve from it."""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import sys

import httpx
import pytest

from basal.cli import build_parser, main
from basal.serve.flags import serve_config
from basal.serve.server import build_engines
from tests.ports import free_port
from tests.servers import live_server

REPO = "basal-test/basal-demo"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
BODY = {"model": "jev-latest", "state": "late parcel", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def _loopback(host) -> bool:
    if host in ("localhost", None, ""):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """Every connection or name lookup beyond loopback fails the test (and is recorded)."""
    tried: list[str] = []
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            tried.append(str(address))
            raise OSError(f"the test allows no network: {address}")
        return connect(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if not _loopback(host):
            tried.append(str(host))
            raise socket.gaierror(f"the test allows no network: {host}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    return tried


@pytest.fixture
def hf_home(tmp_path, demo_dir, monkeypatch):
    """HF_HOME with the demo model as REPO at COMMIT, branch main pointing at it."""
    home = tmp_path / "hf"
    repo = home / "hub" / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(demo_dir.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(f"../../blobs/{blob.name}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "BASAL_MODEL", "BASAL_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return snapshot


def without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` raises ImportError


def serve_one_decision(model: str) -> dict:
    config = serve_config(build_parser().parse_args(["serve", "--model", model]))
    engines = build_engines(config)
    with live_server(engines) as url:
        reply = httpx.post(f"{url}/v1/systemone", json=BODY)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_serves_from_the_cache_offline_through_huggingface_hub(hf_home, no_network, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert serve_one_decision(REPO)["model"] == "basal-synthetic-demo"
    assert no_network == []


def test_serves_from_the_cache_without_huggingface_hub(hf_home, no_network, monkeypatch):
    without_huggingface_hub(monkeypatch)
    assert serve_one_decision(f"{REPO}@{COMMIT}")["model"] == "basal-synthetic-demo"
    assert no_network == []


def test_a_hub_that_cannot_be_reached_serves_the_cache(hf_home, no_network):
    pytest.importorskip("huggingface_hub")
    from basal.serve.hub import snapshot

    assert snapshot(REPO, "main") == hf_home
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:  # read once at its import: an earlier import may have seen HF_HUB_OFFLINE=1
        assert no_network  # huggingface_hub asked the hub first (the guard refused), then the cache served


def test_a_revision_not_in_the_cache_says_how_to_fetch_it(hf_home, no_network, monkeypatch, capsys):
    without_huggingface_hub(monkeypatch)
    assert main(["serve", "--addr", f"127.0.0.1:{free_port()}", "--model", f"{REPO}@v2"]) == 2
    err = capsys.readouterr().err
    assert f"{REPO}@v2 is not in the Hugging Face cache" in err and f"basal download {REPO}@v2" in err
    assert "basal-bitwise[hub]" in err and no_network == []


def test_download_prints_the_snapshot_and_needs_the_hub_extra(hf_home, no_network, monkeypatch, capsys):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["download", REPO]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(hf_home) and "basal-synthetic-demo" in err
    assert main(["download", "not a repo id"]) == 2
    assert "owner/name" in capsys.readouterr().err
    without_huggingface_hub(monkeypatch)
    assert main(["download", REPO]) == 2
    assert "pip install 'basal-bitwise[hub]'" in capsys.readouterr().err
    assert no_network == []
