"""Schema fuzz: requests generated from the server's own OpenAPI document, every response checked against it
(status listed, content type, body schema, required headers) and never a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from litestar.testing import TestClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from basal.api.app import create_app
from basal.api.settings import ApiSettings
from tests.servers import make_engines

EXAMPLES = 40  # per operation
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


@pytest.fixture(scope="module")
def fuzz_app(demo_model):
    app = create_app(make_engines(demo_model), ApiSettings(metrics=False, max_body_bytes=1 << 20))
    with TestClient(app):  # runs the lifespan: the lanes are started
        yield app


def operations(app) -> list:
    schema = schemathesis.openapi.from_asgi("/schema/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


def test_every_response_matches_the_schema(fuzz_app):
    ops = operations(fuzz_app)
    assert {f"{op.method.upper()} {op.path}" for op in ops} >= {
        "POST /v1/systemone",
        "POST /v1/basal",
        "GET /v1/models",
        "GET /health",
        "GET /metrics",
    }
    for op in ops:

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            case.call_and_validate(checks=CHECKS)

        check()
