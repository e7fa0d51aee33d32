"""With API keys, files and batches belong to the key that created them: another key gets, on every Files and
Batches route, exactly what an id that never existed gets (the same 404 body, the same 400 for a cursor), lists
only its own, and cannot reuse them (a batch from another key's file, its idempotency keys). An admin key sees
all; `batches_shared` shares them again; batch lines run in their owner's cache scope. Both stores."""

from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest

from basal.api.settings import ApiSettings
from tests.api.test_batches import requests_, service
from tests.postgres import KINDS, database_for
from tests.servers import live_server, make_engines

A, B, ADMIN = "key-a", "key-b", "key-admin"
UNKNOWN_FILE, UNKNOWN_BATCH = "file-" + "0" * 32, "batch_" + "0" * 32


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def upload(url: str, key: str, tag: str) -> dict:
    lines = b"".join(
        json.dumps({**r, "method": "POST", "url": "/v1/basal"}).encode() + b"\n" for r in requests_(1, 2, tag)
    )
    answer = httpx.post(
        f"{url}/v1/files", headers=auth(key), data={"purpose": "batch"}, files={"file": ("in.jsonl", lines)}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def create(url: str, key: str, file_id: str, idempotency_key: str | None = None) -> httpx.Response:
    headers = {**auth(key), **({"idempotency-key": idempotency_key} if idempotency_key else {})}
    return httpx.post(f"{url}/v1/batches", headers=headers, json={"input_file_id": file_id, "endpoint": "/v1/basal",
                                                                   "completion_window": "24h"})  # fmt: skip


def finished(url: str, key: str, batch_id: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        batch = httpx.get(f"{url}/v1/batches/{batch_id}", headers=auth(key)).json()
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)


def ids(url: str, key: str, what: str, **params) -> list[str]:
    page = httpx.get(f"{url}/v1/{what}", headers=auth(key), params={"limit": 100, **params})
    assert page.status_code == 200, page.text
    return [item["id"] for item in page.json()["data"]]


def as_unknown(url: str, key: str, method: str, path: str, real: str, unknown: str, **kw) -> None:
    """`key` gets for `real` exactly what it gets for an id that never existed (the id itself aside)."""
    got = httpx.request(method, f"{url}{path.format(real)}", headers=auth(key), **kw)
    never = httpx.request(method, f"{url}{path.format(unknown)}", headers=auth(key), **kw)
    assert (got.status_code, got.content) == (never.status_code, never.content.replace(unknown.encode(), real.encode()))
    assert got.status_code in (400, 404), (path, got.status_code)


@pytest.fixture(scope="module", params=KINDS)
def tenants(demo_model, tmp_path_factory, request):
    """A server with keys A and B and an admin key; A's file and its finished batch, B's file and batch."""
    settings = ApiSettings(api_keys=(A, B), admin_keys=(ADMIN,))
    svc = service(tmp_path_factory.mktemp("batches"), database_for(request.param, request))
    with live_server(make_engines(demo_model), settings, batches=svc) as url:
        mine = {}
        for key in (A, B):
            file = upload(url, key, key)
            made = create(url, key, file["id"])
            assert made.status_code == 200, made.text
            mine[key] = (file, finished(url, key, made.json()["id"]))
        yield url, mine, svc


def test_another_key_finds_nothing_of_a_key_on_any_route(tenants):
    url, mine, _ = tenants
    file, batch = mine[A]
    assert batch["status"] == "completed" and batch["output_file_id"]
    for fid in (file["id"], batch["output_file_id"]):  # the input and the batch's output file: both A's
        as_unknown(url, B, "GET", "/v1/files/{}", fid, UNKNOWN_FILE)
        as_unknown(url, B, "GET", "/v1/files/{}/content", fid, UNKNOWN_FILE)
        as_unknown(url, B, "DELETE", "/v1/files/{}", fid, UNKNOWN_FILE)
        cursor = httpx.get(f"{url}/v1/files", headers=auth(B), params={"after": fid})
        unknown = httpx.get(f"{url}/v1/files", headers=auth(B), params={"after": UNKNOWN_FILE})
        assert cursor.status_code == unknown.status_code == 400
        assert cursor.content == unknown.content.replace(UNKNOWN_FILE.encode(), fid.encode())
    as_unknown(url, B, "GET", "/v1/batches/{}", batch["id"], UNKNOWN_BATCH)
    as_unknown(url, B, "POST", "/v1/batches/{}/cancel", batch["id"], UNKNOWN_BATCH)
    cursor = httpx.get(f"{url}/v1/batches", headers=auth(B), params={"after": batch["id"]})
    unknown = httpx.get(f"{url}/v1/batches", headers=auth(B), params={"after": UNKNOWN_BATCH})
    assert cursor.status_code == 400 and cursor.content == unknown.content.replace(
        UNKNOWN_BATCH.encode(), batch["id"].encode()
    )
    stolen, never = create(url, B, file["id"]), create(url, B, UNKNOWN_FILE)  # a batch from A's input file
    assert stolen.status_code == never.status_code == 404
    assert stolen.content == never.content.replace(UNKNOWN_FILE.encode(), file["id"].encode())
    # and A still has all of it, untouched by B's tries
    assert httpx.get(f"{url}/v1/files/{file['id']}", headers=auth(A)).json() == file
    assert httpx.get(f"{url}/v1/files/{batch['output_file_id']}/content", headers=auth(A)).status_code == 200
    assert httpx.get(f"{url}/v1/batches/{batch['id']}", headers=auth(A)).json() == batch


def test_lists_hold_only_the_keys_own(tenants):
    url, mine, _ = tenants
    for key, other in ((A, B), (B, A)):
        file, batch = mine[key]
        files, batches = ids(url, key, "files"), ids(url, key, "batches")
        assert {file["id"], batch["output_file_id"]} <= set(files) and batch["id"] in batches
        theirs_file, theirs_batch = mine[other]
        assert not {theirs_file["id"], theirs_batch["output_file_id"]} & set(files)
        assert theirs_batch["id"] not in batches
        assert ids(url, key, "files", purpose="batch_output") == [batch["output_file_id"]]


def test_an_idempotency_key_is_the_keys_own(tenants):
    url, mine, _ = tenants
    first = create(url, A, mine[A][0]["id"], "job-shared-name")
    again = create(url, B, mine[B][0]["id"], "job-shared-name")  # other data, another key: no 409, a batch of B's
    assert first.status_code == again.status_code == 200 and first.json()["id"] != again.json()["id"]
    assert create(url, A, mine[A][0]["id"], "job-shared-name").json()["id"] == first.json()["id"]
    for key, made in ((A, first), (B, again)):
        finished(url, key, made.json()["id"])


def test_an_admin_key_sees_every_keys_work_and_is_a_key(tenants):
    url, mine, _ = tenants
    files, batches = ids(url, ADMIN, "files"), ids(url, ADMIN, "batches")
    for file, batch in mine.values():
        assert {file["id"], batch["output_file_id"]} <= set(files) and batch["id"] in batches
        assert httpx.get(f"{url}/v1/batches/{batch['id']}", headers=auth(ADMIN)).json()["id"] == batch["id"]
        assert httpx.get(f"{url}/v1/files/{batch['output_file_id']}/content", headers=auth(ADMIN)).status_code == 200
    body = requests_(1, 1)[0]["body"]
    assert httpx.post(f"{url}/v1/basal", json=body, headers=auth(ADMIN)).status_code == 200
    assert httpx.get(f"{url}/v1/files", headers=auth("key-c")).status_code == 401  # still a key that is checked
    own = upload(url, ADMIN, "admin")  # the admin's own file is not A's or B's
    assert own["id"] in ids(url, ADMIN, "files") and own["id"] not in ids(url, A, "files") + ids(url, B, "files")


def test_the_owner_stored_is_the_keys_digest_never_the_key(tenants):
    _, mine, svc = tenants
    file, batch = mine[A]
    digest = hashlib.sha256(A.encode()).hexdigest()
    assert svc.store.get_file(file["id"])["owner"] == digest == svc.store.get_batch(batch["id"])["owner"]
    assert svc.store.get_file(batch["output_file_id"], digest) is not None  # the output is the batch owner's
    assert svc.store.get_file(file["id"], hashlib.sha256(B.encode()).hexdigest()) is None


def test_batches_shared_lets_every_key_see_every_file_and_batch(demo_model, tmp_path, database):
    settings = ApiSettings(api_keys=(A, B), batches_shared=True)
    with live_server(make_engines(demo_model), settings, batches=service(tmp_path, database)) as url:
        file = upload(url, A, "shared")
        batch = create(url, B, file["id"])  # B may run A's file
        assert batch.status_code == 200
        done = finished(url, A, batch.json()["id"])  # and A sees B's batch
        assert done["status"] == "completed"
        assert {file["id"], done["output_file_id"]} <= set(ids(url, B, "files")) & set(ids(url, A, "files"))
        assert httpx.get(f"{url}/v1/files/{done['output_file_id']}/content", headers=auth(A)).status_code == 200


def test_without_keys_every_caller_sees_everything(demo_model, tmp_path):
    with live_server(make_engines(demo_model), ApiSettings(), batches=service(tmp_path, None)) as url:
        file = upload(url, "anything", "open")
        assert file["id"] in ids(url, "other", "files")
        done = finished(url, "x", create(url, "y", file["id"]).json()["id"])
        assert done["status"] == "completed" and done["id"] in ids(url, "z", "batches")


@pytest.mark.parametrize("shared", [False, True])
def test_batch_lines_run_in_their_owners_cache_scope(demo_model, tmp_path, monkeypatch, shared):
    engines = make_engines(demo_model)
    engine = engines.engines[engines.default]
    seen: list[str] = []
    plain = engine.admit
    monkeypatch.setattr(
        engine, "admit", lambda request, *a, **k: seen.append(request.cache_scope) or plain(request, *a, **k)
    )
    settings = ApiSettings(api_keys=(A, B), caches_shared=shared)
    with live_server(engines, settings, batches=service(tmp_path, None)) as url:
        for key in (A, B):
            finished(url, key, create(url, key, upload(url, key, f"scope-{key}")["id"]).json()["id"])
            httpx.post(f"{url}/v1/basal", json=requests_(1, 1, key)[0]["body"], headers=auth(key))
    digests = [hashlib.sha256(k.encode()).hexdigest() for k in (A, B)]
    if shared:
        assert set(seen) == {""}
    else:  # each key's lines and its online request in its own scope: 2 lines + 1 online each
        assert seen == [digests[0]] * 3 + [digests[1]] * 3, seen


def test_a_key_with_non_ascii_characters_is_one_owner_and_can_be_an_admin():
    from types import SimpleNamespace

    from basal.api.http.auth import key_verdict, request_owner, visible_owner

    key = "klucz-zażółć"
    settings = ApiSettings(api_keys=("plain",), admin_keys=(key,))
    header = "Bearer " + key.encode("utf-8").decode("latin-1")  # the header as the ASGI server hands it over
    request = SimpleNamespace(headers={"authorization": header})
    assert key_verdict(header, settings.api_keys) is None
    assert request_owner(request, settings) == hashlib.sha256(key.encode("utf-8")).hexdigest()
    assert visible_owner(request, settings) is None  # the admin digest matches the configured key's
    plain = SimpleNamespace(headers={"authorization": "Bearer plain"})
    assert visible_owner(plain, settings) == hashlib.sha256(b"plain").hexdigest()
