"""basal on Ray Serve (a local Ray, 2 CPU replicas of the demo model): the same answers, bit for bit, as one
process; state affinity; overload; a replica killed during load."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("ray")

from basal.core.errors import Cancelled
from basal.ray_serve.app import start
from basal.ray_serve.ingress import RayEngines, _cancellable
from basal.serve.config import parse_config
from tests.servers import live_server, make_engines

MODEL = "basal-synthetic-demo"
LONG = [
    f"Zgłoszenie {i}: klient pisze, że paczka nr {i} dotarła uszkodzona i żąda zwrotu pieniędzy. " * 5
    for i in range(16)
]


def mix() -> list[tuple[str, dict]]:
    out = []
    for i in range(10):
        questions = {
            "refund": {"type": "noul", "instructions": f"Czy należy się zwrot {i}?"},
            "team": {
                "type": "choice",
                "criteria": {"billing": "Płatności", "logistics": f"Dostawa {i}", "other": None},
            },
            "anger": {"type": "score", "instructions": "Jak bardzo zły?", "criteria": ["spokój", "złość", "furia"]},
        }
        state = LONG[i % 3] if i % 2 else {"ticket": f"Faktura {i} bez numeru NIP", "amount": 1299.0 + i}
        out.append(
            ("/v1/systemone" if i % 3 else "/v1/basal", {"model": MODEL, "state": state, "questions": questions})
        )
    out.append(("/v1/basal", {"state": "x", "questions": {"q": {"type": "score", "criteria": ["only"]}}}))  # 422
    return out


def comparable(r: httpx.Response) -> tuple[int, object]:
    body = r.json()
    if r.status_code == 200:
        body["usage"].pop("latency_ms", None)  # wall time, not an answer
        body["usage"].pop("cached_tokens", None)  # what the replica's state cache held (on by default there)
    return r.status_code, body


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    engines = start(parse_config({"ray": {"replicas": 2}}))
    try:
        yield engines
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def ray_url(cluster):
    with live_server(cluster) as url:
        yield url


def test_answers_over_ray_equal_one_process_bit_for_bit(ray_url, demo_model):
    requests = mix()
    with live_server(make_engines(demo_model)) as local_url, httpx.Client(timeout=120) as client:
        alone = [comparable(client.post(local_url + path, json=body)) for path, body in requests]
        with ThreadPoolExecutor(8) as pool:
            over_ray = list(pool.map(lambda pb: comparable(client.post(ray_url + pb[0], json=pb[1])), requests))
    assert over_ray == alone
    assert alone[-1][0] == 422


def test_models_over_ray_describe_what_one_process_describes(ray_url, demo_model):
    """`GET /v1/models` on the Ray front: the capabilities one process announces, and the replica's compute."""
    with live_server(make_engines(demo_model)) as local_url:
        alone = httpx.get(local_url + "/v1/models", timeout=60)
    over_ray = httpx.get(ray_url + "/v1/models", timeout=60)
    assert over_ray.status_code == alone.status_code == 200
    (ray_model,), (local_model,) = over_ray.json()["models"], alone.json()["models"]
    ray_compute, local_compute = ray_model.pop("compute"), local_model.pop("compute")
    assert ray_model == local_model and ray_model["evidence"] is True
    same = ("backend", "device", "dtype")  # threads and the probed GEMM chunks are each process's own
    assert {k: ray_compute[k] for k in same} == {k: local_compute[k] for k in same}
    assert ray_compute.keys() == local_compute.keys()


def test_evidence_over_ray_equals_one_process(ray_url, demo_model):
    body = {
        "model": MODEL,
        "state": LONG[2],
        "questions": {"refund": {"type": "noul", "instructions": "Czy należy się zwrot?", "evidence": True}},
    }
    with live_server(make_engines(demo_model)) as local_url:
        alone = comparable(httpx.post(local_url + "/v1/basal", json=body, timeout=120))
    over_ray = comparable(httpx.post(ray_url + "/v1/basal", json=body, timeout=120))
    assert over_ray == alone and alone[0] == 200 and alone[1]["answers"]["refund"]["evidence"]


def test_the_official_sdk_over_ray(ray_url):
    from typesafe_sdk import Noul, RetryPolicy, TypeSafeClient

    with TypeSafeClient(api_key="k", base_url=ray_url, retry=RetryPolicy(max_retries=0)) as client:
        r = client.system_one(state=LONG[0], questions={"refund": Noul(instructions="Czy należy się zwrot?")})
    assert r.model == MODEL and 0 <= r.nouls["refund"].noul <= 1


def test_a_state_stays_on_its_replica_and_states_spread(ray_url):
    def replica(state: str, i: int) -> str:
        body = {"model": MODEL, "state": state, "questions": {"q": {"type": "noul", "instructions": f"Pytanie {i}?"}}}
        r = httpx.post(ray_url + "/v1/systemone", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.headers["x-basal-replica"]

    assert len({replica(LONG[0], i) for i in range(6)}) == 1
    assert len({replica(state, 0) for state in LONG}) == 2  # 16 states on 2 replicas: both get some


def test_a_saturated_preferred_replica_spills_to_the_other(ray_url):
    """32 requests about one state at once: past `router_max_queue` (8) in flight on the state's replica, the
    router sends the rest to the less loaded of two."""
    questions = {f"q{i}": {"type": "noul", "instructions": f"Pytanie {i}?"} for i in range(20)}
    body = {"model": MODEL, "state": LONG[5], "questions": questions}
    with ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(lambda _: httpx.post(ray_url + "/v1/systemone", json=body, timeout=180), range(32)))
    assert all(r.status_code == 200 for r in responses)
    answers = {r.text for r in responses}
    assert len(answers) == 1  # the same answer from either replica
    assert len({r.headers["x-basal-replica"] for r in responses}) == 2


def test_the_fronts_inflight_limit_answers_529(cluster):
    tight = RayEngines(cluster.handles, cluster.infos, cluster.default, max_inflight=1)
    body = {
        "model": MODEL,
        "state": LONG[1],
        "questions": {f"q{i}": {"type": "noul", "instructions": f"{i}?"} for i in range(20)},
    }
    with live_server(tight) as url, ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: httpx.post(url + "/v1/systemone", json=body, timeout=120), range(6)))
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 529 in statuses and set(statuses) <= {200, 529}
    assert all(r.headers["retry-after"] == "1" for r in responses if r.status_code == 529)


def test_a_client_that_leaves_cancels_the_call():
    class Hanging:
        cancelled = False

        def __await__(self):
            return asyncio.sleep(3600).__await__()

        def cancel(self):
            self.cancelled = True

    call = Hanging()
    with pytest.raises(Cancelled):
        asyncio.run(_cancellable(call, lambda: True))
    assert call.cancelled


def test_a_replica_killed_during_load_loses_nothing(cluster, ray_url):
    import ray

    def replicas() -> set[str]:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]}

    requests = [r for r in mix() if r[0] == "/v1/systemone"] * 3
    with httpx.Client(timeout=180) as client:
        expected = [comparable(client.post(ray_url + p, json=b)) for p, b in requests[:6]]
        victim = sorted(replicas())[0]
        with ThreadPoolExecutor(6) as pool:
            futures = [
                pool.submit(lambda pb: comparable(client.post(ray_url + pb[0], json=pb[1])), r) for r in requests
            ]
            time.sleep(0.5)
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            results = [f.result() for f in futures]
    assert results == (expected * 3)[: len(results)]  # every request answered, and answered right
    deadline = time.monotonic() + 180
    while not (len(replicas()) == 2 and victim not in replicas()):
        assert time.monotonic() < deadline, "Ray did not bring the killed replica back"
        time.sleep(1)


def test_the_replicas_engine_series_reach_the_fronts_metrics(cluster, ray_url):
    """A Ray deployment shows the engine series of one process, each sample labelled with its replica."""
    from prometheus_client.parser import text_string_to_metric_families

    with httpx.Client(timeout=120) as client:
        for path, body in mix()[:4]:
            client.post(ray_url + path, json=body)
    deadline = time.monotonic() + 60
    while True:  # replicas push every 2 s
        text = cluster.metrics.render()
        found = {f.name: f for f in text_string_to_metric_families(text)}
        batches = [
            s
            for s in found["basal_batch_requests"].samples
            if s.name.endswith("_count") and "replica" in s.labels and s.value > 0
        ]
        if batches or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert batches, text
    replicas = {s.labels["replica"] for s in found["basal_build_info"].samples if "replica" in s.labels}
    assert len(replicas) == 2
    for name in ("basal_queue_duration_seconds", "basal_batch_duration_seconds", "basal_batch_requests"):
        assert any(s.labels.get("replica") in replicas for s in found[name].samples), name
    assert any(s.labels.get("replica") in replicas for s in found["process_resident_memory_bytes"].samples)
    front = [s for s in found["basal_http_requests"].samples if "replica" not in s.labels]
    assert front  # the front's own HTTP series beside them
    types = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))  # each family once, as the text format requires


def test_a_batch_behind_the_ray_front_answers_as_one_process(cluster, demo_model, tmp_path):
    """The front owns the batch store; lines go to the replicas through the router as background work."""
    from basal_client import BasalClient

    from basal.batch.service import BatchService, BatchSettings
    from basal.batch.store import open_store

    service = BatchService(open_store(tmp_path), BatchSettings(root=tmp_path, window=8))
    requests = [
        {"custom_id": f"{path}-{i}", "body": body} for i, (path, body) in enumerate(mix()) if path == "/v1/basal"
    ]
    with live_server(cluster, batches=service) as url, BasalClient(url, timeout=120) as client:
        batch = client.batches.create(requests=requests)
        done = client.batches.wait(batch["id"], timeout=300, poll_interval=0.1)
        records = {r["custom_id"]: r["response"] for r in client.batches.results(batch["id"])}
    assert done["status"] == "completed" and done["request_counts"]["total"] == len(requests)
    with live_server(make_engines(demo_model)) as local_url:
        for r in requests:
            alone = comparable(httpx.post(local_url + "/v1/basal", json=r["body"], timeout=120))
            response = records[r["custom_id"]]
            body = response["body"]
            if response["status_code"] == 200:
                body["usage"].pop("latency_ms", None)
                body["usage"].pop("cached_tokens", None)
            assert (response["status_code"], body) == alone
