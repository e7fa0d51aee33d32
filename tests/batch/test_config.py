"""`batches:` in the configuration: on by default only where the server listens on loopback, its limits checked,
and its store where `dir` (or $BASAL_HOME) says."""

from __future__ import annotations

import pytest

from basal.serve.config import ConfigError, parse_config
from basal.serve.server import batch_service, batch_settings


@pytest.mark.parametrize(
    ("data", "on"),
    [
        ({}, True),
        ({"addr": "[::1]:8000"}, True),
        ({"addr": "localhost:8000"}, True),
        ({"addr": "0.0.0.0:8000"}, False),
        ({"addr": "0.0.0.0:8000", "batches": {"enabled": True}}, True),
        ({"batches": {"enabled": False}}, False),
    ],
)
def test_on_by_default_on_loopback_only(data, on, tmp_path):
    config = parse_config({**data, "batches": {"dir": str(tmp_path), **data.get("batches", {})}})
    assert config.batches_enabled is on
    service = batch_service(config)
    assert (service is not None) is on
    if service is not None:
        service.store.close()


def test_limits_and_the_store_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("BASAL_HOME", str(tmp_path))
    settings = batch_settings(parse_config({"batches": {"max_upload_mb": 1, "max_line_kb": 2, "retention_days": 0}}))
    assert settings.root == tmp_path / "batches"
    assert (settings.max_upload_bytes, settings.max_line_bytes, settings.output_retention_s) == (1_000_000, 2048, None)
    with pytest.raises(ConfigError, match="max_lines"):
        parse_config({"batches": {"max_lines": 0}})
    with pytest.raises(ConfigError, match="did you mean `max_lines`"):
        parse_config({"batches": {"max_line": 10}})


def test_the_database_key_and_its_environment_variable(tmp_path, monkeypatch):
    from basal.serve.config import with_environment

    assert batch_settings(parse_config({"batches": {"database": "sqlite"}})).database is None
    monkeypatch.setenv("BASAL_BATCHES__DATABASE", "postgresql://basal@db:5432/basal")
    monkeypatch.setenv("BASAL_BATCHES__LEASE_S", "5")
    settings = batch_settings(parse_config(with_environment({})))
    assert (settings.database, settings.lease_s) == ("postgresql://basal@db:5432/basal", 5.0)
    with pytest.raises(ConfigError, match="postgresql://USER"):
        parse_config({"batches": {"database": "mysql://x"}})


def test_an_unreachable_database_is_a_clear_error_without_its_password(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'basal-bitwise[postgres]'")
    from basal.batch.store import StoreError
    from tests.ports import free_port

    url = f"postgresql://basal:s3cret@127.0.0.1:{free_port()}/basal"
    with pytest.raises(StoreError, match="cannot use the batch database at postgresql://basal:\\*\\*\\*@") as e:
        batch_service(parse_config({"batches": {"dir": str(tmp_path), "database": url}}))
    assert "s3cret" not in str(e.value)
