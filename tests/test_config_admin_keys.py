"""`admin_api_keys` and `batches_shared`: admin keys are keys (they turn authentication on alone, and are refused
empty, padded, beside `no_auth`, or set empty in the environment with no other key), and the settings the server
builds from them say whose files and batches each key sees."""

from __future__ import annotations

import hashlib
import os

import pytest

from basal.cli import build_parser
from basal.serve.config import NOT_KEYS, ConfigError, parse_config
from basal.serve.flags import serve_config
from basal.serve.server import api_settings, exposure_warnings


@pytest.fixture
def clean_environment(monkeypatch):
    for var in [v for v in os.environ if v.startswith("BASAL_") and v not in NOT_KEYS]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("BASAL_MODEL", raising=False)
    monkeypatch.delenv("BASAL_CONFIG", raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"admin_api_keys": [""]}, "`admin_api_keys` has item 1 of 1, which is an empty API key"),
        ({"admin_api_keys": ["ok", " \t"]}, "`admin_api_keys` has item 2 of 2, which is an empty API key"),
        ({"admin_api_keys": ["key "]}, "`admin_api_keys` has item 1 of 1, which is an API key that starts or ends"),
        ({"admin_api_keys": "root"}, "`admin_api_keys` is 'root' (text): expected a list of text (api key)"),
        ({"no_auth": True, "admin_api_keys": ["k"]}, "but `admin_api_keys` gives 1: remove one of the two"),
        ({"batches_shared": "yes"}, "`batches_shared` is 'yes' (text): expected true or false"),
    ],
)
def test_bad_admin_keys_are_refused_naming_the_key(data, words, clean_environment):
    with pytest.raises(ConfigError) as e:
        parse_config(data, "serve.yml")
    assert words in str(e.value)


def test_an_admin_key_is_a_key_that_sees_all(clean_environment):
    settings = api_settings(parse_config({"api_keys": ["a"], "admin_api_keys": ["root", "a"]}))
    assert settings.api_keys == ("a", "root")  # every key once; an admin key authenticates on every route
    assert settings.admin_owners == {hashlib.sha256(k.encode()).hexdigest() for k in ("root", "a")}
    alone = parse_config({"addr": "0.0.0.0:8000", "admin_api_keys": ["root"]})
    assert api_settings(alone).api_keys == ("root",)
    assert not [w for w in exposure_warnings(alone, api_settings(alone)) if "no API key" in w]  # not an open server
    assert not api_settings(parse_config({})).batches_shared
    assert api_settings(parse_config({"batches_shared": True})).batches_shared


def test_an_empty_admin_key_list_from_the_environment_is_no_open_server(clean_environment):
    clean_environment.setenv("BASAL_ADMIN_API_KEYS", " , ")
    with pytest.raises(ConfigError, match=r"has an empty item|empty API key"):
        parse_config({})
    clean_environment.setenv("BASAL_ADMIN_API_KEYS", "")
    with pytest.raises(ConfigError, match="BASAL_ADMIN_API_KEYS is set but holds no key"):
        parse_config({})
    assert parse_config({"api_keys": ["k"]}).admin_api_keys == []  # other keys: not open, just no admin
    clean_environment.setenv("BASAL_NO_AUTH", "true")
    assert api_settings(parse_config({})).api_keys == ()  # open on purpose
    clean_environment.delenv("BASAL_NO_AUTH")
    clean_environment.setenv("BASAL_ADMIN_API_KEYS", "root,ops")
    assert api_settings(parse_config({})).api_keys == ("root", "ops")


def test_the_flags(clean_environment):
    parser = build_parser()
    config = serve_config(parser.parse_args(["serve", "--admin-api-key", "r1", "--admin-api-key", "r2"]))
    assert config.admin_api_keys == ["r1", "r2"] and not config.batches_shared
    assert serve_config(parser.parse_args(["serve", "--api-key", "k", "--batches-shared"])).batches_shared
