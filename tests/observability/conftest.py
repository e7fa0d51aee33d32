from __future__ import annotations

import pytest

from tests.servers import make_engines


@pytest.fixture(scope="module")
def engines(demo_model):
    return make_engines(demo_model)
