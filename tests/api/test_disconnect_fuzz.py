"""A client that goes away is never computed; fuzzed bodies never give a 500 or a hang."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.engine.test_scheduling import device_held
from tests.core.model.test_render import json_values
from tests.core.request.test_contract import question_values
from tests.servers import live_server, make_engines


def test_disconnected_client_is_dropped_before_its_batch(demo_model):
    engines = make_engines(demo_model)
    engine = engines.engines["basal-synthetic-demo"]
    body = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    with live_server(engines) as url:
        with device_held(engines):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/v1/systemone", json=body, timeout=0.5)  # gives up and closes the connection
            time.sleep(0.3)
        deadline = time.monotonic() + 10
        while engine.cancelled_jobs == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.cancelled_jobs == 1 and engine.computed_jobs == 0
        assert httpx.post(f"{url}/v1/systemone", json=body, timeout=30).status_code == 200
        assert engine.computed_jobs == 1
        assert 'status="499"' in engines.metrics.render()


bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.sampled_from(["basal-synthetic-demo", "jev-latest", "x"]) | json_values,
            "state": json_values,
            "questions": st.dictionaries(st.text(max_size=4), question_values, max_size=3) | json_values,
        },
    ).map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, path=st.sampled_from(["/v1/systemone", "/v1/basal"]))
def test_fuzz_no_500_and_always_json(client, body, path):
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400, 413, 422), (r.status_code, r.text)
    assert isinstance(r.json(), dict)
