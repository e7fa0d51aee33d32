from __future__ import annotations

import pytest

from tests.determinism.harness import Harness, available, combo_id

COMBOS = available()


@pytest.fixture(scope="module", params=COMBOS, ids=[combo_id(c) for c in COMBOS])
def harness(request, demo_model) -> Harness:
    backend, device, dtype = request.param
    return Harness(demo_model, backend, device, dtype)
