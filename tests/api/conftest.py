from __future__ import annotations

import pytest
from litestar.testing import TestClient

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from tests.servers import live_server, make_engines


@pytest.fixture(scope="module")
def engines(demo_model):
    return make_engines(demo_model)


@pytest.fixture(scope="module")
def client(engines):
    with TestClient(create_app(engines, ApiSettings(metrics=True, max_body_bytes=1 << 20))) as c:
        yield c


@pytest.fixture(scope="module")
def server(demo_model):
    engines = make_engines(demo_model)
    with live_server(engines, ApiSettings(metrics=True)) as url:
        yield url, engines


@pytest.fixture(scope="module")
def headless_client(headless_model):
    """A server of the demo model without its evidence head."""
    with TestClient(create_app(make_engines(headless_model))) as c:
        yield c
