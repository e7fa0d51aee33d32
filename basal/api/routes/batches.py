"""The Files and Batches API (docs/batches.md): the routes that basal-client's `files` and `batches` call.

Uploads are read from the ASGI stream, checked line by line and written to a temporary file in the store as they
arrive (`http/multipart.py`, `StoredUpload`), in memory bounded by a line, not by the file.
With API keys, each file and batch belongs to the key that created them: a request of another key finds it as it
finds an id that never existed (the same 404, an unknown cursor's 400), unless it is an admin key or the operator
shares them (`batches_shared`); see `auth.visible_owner`.
Every refusal is a `batch_refusal` (`api/errors.py`): `{"error": {message, type, param, code}}`, the shape an
OpenAI-Batch user expects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import File

from basal.api.context import api_context
from basal.api.errors import ClientGone, batch_refusal
from basal.api.http.auth import check_auth, request_owner, visible_owner
from basal.api.http.multipart import read_upload
from basal.api.settings import ApiSettings
from basal.api.wire.batch_types import (
    MAX_EXPIRES_S,
    MIN_EXPIRES_S,
    ApiError,
    BatchErrors,
    BatchList,
    BatchObject,
    CreateBatch,
    DeletedFile,
    FileList,
    FileObject,
    RequestCounts,
)
from basal.api.wire.openapi import documented, json_schema
from basal.batch.lines import UploadCheck, UploadRefused
from basal.batch.service import WINDOW_S, BatchService, BatchSettings
from basal.batch.store import ACTIVE, Conflict, TooMany, WriteFailed, disk_problem
from basal.core.errors import Overloaded, RequestError

log = logging.getLogger(__name__)

MAX_LIST = 100  # one page of a list, at most (OpenAI's batch list limit)
DEFAULT_LIST = 20
MAX_METADATA = 16  # metadata pairs; keys up to 64 characters, values up to 512 (as OpenAI)
JSONL = "application/jsonl"


def _auth(request: Request) -> str | None:
    """Check the key. -> whose files and batches the request sees (`auth.visible_owner`: None for all)."""
    settings = api_context(request).settings
    try:
        check_auth(request, settings, "basal")
    except RequestError as e:
        raise batch_refusal(e.status, "invalid_api_key", e.body["error"]) from None
    return visible_owner(request, settings)


def _service(request: Request) -> BatchService:
    service = api_context(request).batches
    assert service is not None  # these routes are registered only with a service
    return service


def file_object(row: dict) -> FileObject:
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        filename=row["filename"],
        purpose=row["purpose"],
    )


def batch_object(row: dict) -> BatchObject:
    errors = msgspec.convert(json.loads(row["errors"]), BatchErrors) if row["errors"] else None
    return BatchObject(
        id=row["id"],
        endpoint=row["endpoint"],
        model=row["model"],
        errors=errors,
        input_file_id=row["input_file_id"],
        completion_window=row["completion_window"],
        status=row["status"],
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        created_at=row["created_at"],
        in_progress_at=row["in_progress_at"],
        expires_at=row["expires_at"],
        finalizing_at=row["finalizing_at"],
        completed_at=row["completed_at"],
        failed_at=row["failed_at"],
        expired_at=row["expired_at"],
        cancelling_at=row["cancelling_at"],
        cancelled_at=row["cancelled_at"],
        request_counts=RequestCounts(total=row["total"], completed=row["completed"], failed=row["failed"]),
        metadata=json.loads(row["metadata"]) if row["metadata"] else None,
    )


def _list_args(request: Request, known: Callable[[str], object]) -> tuple[str | None, int]:
    """`after` (a cursor: an id `known` finds) and `limit` of a list request."""
    after = request.query_params.get("after")
    if after is not None and known(after) is None:
        raise batch_refusal(
            400, "invalid_cursor", f"after={after!r} names nothing in this list (deleted, or never in it)", "after"
        )
    raw = request.query_params.get("limit")
    if raw is None:
        return after, DEFAULT_LIST
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST:
        raise batch_refusal(400, "invalid_limit", f"limit must be a whole number from 1 to {MAX_LIST}", "limit")
    return after, int(raw)


def _page(kind: type[FileList] | type[BatchList], data: list, more: bool) -> FileList | BatchList:
    """One page of a list endpoint: its items, the ids at both ends (the cursor for `after`), whether more follow."""
    return kind(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=more)


def _ok(value: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json")


def _expires_seconds(value: Any, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_EXPIRES_S <= value <= MAX_EXPIRES_S:
        raise batch_refusal(400, "invalid_expires_after", f"{param} must be {MIN_EXPIRES_S} to {MAX_EXPIRES_S}", param)
    return value


# the routes: module-level handlers; a refusal is raised (`batch_refusal`) and answered by the app's `refusal_response`


class StoredUpload:
    """An upload's file part as it arrives: checked line by line (`UploadCheck`, the checks `check_upload` makes)
    and written to the store's temporary file, so an upload holds about a line and a STEP of its bytes in memory,
    whatever its size. `write` runs in a worker thread, one call at a time."""

    def __init__(self, tmp: Path, settings: BatchSettings):
        self.check = UploadCheck(settings.max_lines, settings.max_line_bytes)
        self.file = open(tmp, "wb")  # noqa: SIM115 -- written through the upload; `close` ends it

    @property
    def held(self) -> int:
        return self.check.held

    def write(self, data: bytes) -> None:
        self.check.feed(data)
        self.file.write(data)

    def sync(self) -> None:
        """The whole file on disk (before the store records it)."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def close(self) -> None:
        self.file.close()


async def upload(request: Request) -> Response:
    _auth(request)
    service = _service(request)
    store, limits, api = service.store, service.settings, api_context(request).settings
    tmp = store.upload_path()
    part = StoredUpload(tmp, limits)
    try:
        fields, filename = await read_upload(
            request, limits.max_upload_bytes, part, api.transit, api.limits.max_transit_bytes
        )
        if fields.get("purpose") != "batch":
            raise batch_refusal(400, "invalid_purpose", 'purpose must be "batch"', "purpose")
        expires = None
        if "expires_after[anchor]" in fields or "expires_after[seconds]" in fields:
            if fields.get("expires_after[anchor]") != "created_at":
                raise batch_refusal(
                    400, "invalid_expires_after", 'expires_after[anchor] must be "created_at"', "expires_after"
                )
            seconds = fields.get("expires_after[seconds]", "")
            expires = _expires_seconds(int(seconds) if seconds.isdigit() else -1, "expires_after[seconds]")
        try:
            lines = part.check.finish()
        except UploadRefused as e:
            raise batch_refusal(400, "invalid_file", str(e), "file") from None
        owner = request_owner(request, api_context(request).settings)
        await asyncio.to_thread(part.sync)
        row = await asyncio.to_thread(store.add_file, tmp, filename, "batch", expires, lines, owner)
        return _ok(file_object(row))
    except ClientGone:
        return Response(b"", status_code=499)
    except Overloaded:
        raise batch_refusal(
            529, "overloaded", "too many request bodies are being received at once: retry after a short delay"
        ) from None
    finally:
        part.close()
        tmp.unlink(missing_ok=True)


async def list_files(request: Request) -> Response:
    sees = _auth(request)
    store = _service(request).store
    after, limit = _list_args(request, lambda file_id: store.get_file(file_id, sees))
    purpose = request.query_params.get("purpose")
    if purpose is not None and purpose not in ("batch", "batch_output"):
        raise batch_refusal(400, "invalid_purpose", 'purpose must be "batch" or "batch_output"', "purpose")
    rows, more = store.list_files(after, limit, purpose, sees)
    return _ok(_page(FileList, [file_object(r) for r in rows], more))


def _file(service: BatchService, file_id: str, sees: str | None) -> dict:
    row = service.store.get_file(file_id, sees)
    if row is None:
        raise batch_refusal(404, "file_not_found", f"no file {file_id!r}", "file_id")
    return row


async def get_file(request: Request) -> Response:
    sees = _auth(request)
    return _ok(file_object(_file(_service(request), request.path_params["file_id"], sees)))


async def delete_file(request: Request) -> Response:
    sees = _auth(request)
    service, file_id = _service(request), request.path_params["file_id"]
    _file(service, file_id, sees)
    await asyncio.to_thread(service.store.delete_file, file_id)
    return _ok(DeletedFile(id=file_id))


async def file_content(request: Request) -> Response | File:
    sees = _auth(request)
    service, file_id = _service(request), request.path_params["file_id"]
    _file(service, file_id, sees)
    path = service.store.file_path(file_id)
    if not path.exists():
        raise batch_refusal(404, "file_not_found", f"no file {file_id!r}", "file_id")
    return File(path, media_type=JSONL, content_disposition_type="inline", filename=f"{file_id}.jsonl")


async def create_batch(request: Request) -> Response:
    sees = _auth(request)
    service = _service(request)
    store, limits = service.store, service.settings
    key = request.headers.get("idempotency-key")
    if key is not None and (not 1 <= len(key) <= 128 or any(not "!" <= c <= "~" for c in key)):
        raise batch_refusal(400, "invalid_idempotency_key", "Idempotency-Key must have 1-128 visible ASCII characters")
    raw = await request.body()
    try:
        body = msgspec.json.decode(raw, type=CreateBatch)
    except msgspec.ValidationError as e:
        raise batch_refusal(400, "invalid_request", f"the body does not validate: {e}") from None
    except msgspec.DecodeError as e:
        raise batch_refusal(400, "invalid_json", f"the body is not JSON: {e}") from None
    if body.metadata is not None and (
        len(body.metadata) > MAX_METADATA or any(len(k) > 64 or len(v) > 512 for k, v in body.metadata.items())
    ):
        raise batch_refusal(
            400, "invalid_metadata", "metadata: at most 16 pairs, keys up to 64, values up to 512", "metadata"
        )
    expires = None
    if body.output_expires_after is not None:
        expires = _expires_seconds(body.output_expires_after.seconds, "output_expires_after.seconds")
    file = store.get_file(body.input_file_id, sees)
    if file is None:
        raise batch_refusal(404, "file_not_found", f"no file {body.input_file_id!r}", "input_file_id")
    if file["purpose"] != "batch":
        raise batch_refusal(400, "invalid_input_file", "the input file's purpose must be batch", "input_file_id")
    try:
        row, _ = await asyncio.to_thread(
            store.create_batch,
            body.input_file_id,
            body.endpoint,
            WINDOW_S[body.completion_window],
            body.completion_window,
            body.metadata,
            expires,
            key,
            limits.max_active,
            request_owner(request, api_context(request).settings),
        )
    except Conflict:
        raise batch_refusal(
            409, "idempotency_conflict", "this Idempotency-Key was used for a batch with other data"
        ) from None
    except TooMany:
        raise batch_refusal(
            429, "too_many_batches", f"{limits.max_active} batches are in progress; retry when one ends"
        ) from None
    service.wake()
    return _ok(batch_object(_live(service, row)))


async def list_batches(request: Request) -> Response:
    sees = _auth(request)
    service = _service(request)
    after, limit = _list_args(request, lambda batch_id: service.store.get_batch(batch_id, sees))
    rows, more = service.store.list_batches(after, limit, sees)
    return _ok(_page(BatchList, [batch_object(_live(service, r)) for r in rows], more))


def _batch(service: BatchService, batch_id: str, sees: str | None) -> dict:
    row = service.store.get_batch(batch_id, sees)
    if row is None:
        raise batch_refusal(404, "batch_not_found", f"no batch {batch_id!r}", "batch_id")
    return _live(service, row)


def _live(service: BatchService, row: dict) -> dict:
    """A batch as the API shows it: one whose work waits for the store to write says so in its `errors`."""
    if row["status"] in ACTIVE and service.fault.reason is not None:
        return {**row, "errors": service.fault.batch_errors(row["errors"])}
    return row


def store_refused(request: Request, exc: OSError | WriteFailed) -> Response:
    """The store's disk refused (full, read-only) or its database refuses writes: 507, in words that name no path
    (the operator's log has the error itself). Batch work pauses on the same condition (docs/batches.md). A
    connection error is the client's, not the store's: it has gone (499, as `ClientGone`)."""
    if isinstance(exc, ConnectionError):
        return Response(b"", status_code=499)
    reason = exc.reason if isinstance(exc, WriteFailed) else disk_problem(exc)
    log.warning("%s %s: the batch store refused: %s (%s)", request.method, request.url.path, reason, exc)
    _service(request).fault.failed(exc if isinstance(exc, WriteFailed) else WriteFailed(reason))
    message = f"the batch store cannot write now ({reason}): retry later; the server's log says more"
    return Response(batch_refusal(507, "store_unwritable", message).body, status_code=507)


STORE_REFUSALS = {OSError: store_refused, WriteFailed: store_refused}  # on every Files and Batches route


async def get_batch(request: Request) -> Response:
    sees = _auth(request)
    return _ok(batch_object(_batch(_service(request), request.path_params["batch_id"], sees)))


async def cancel_batch(request: Request) -> Response:
    sees = _auth(request)
    service, batch_id = _service(request), request.path_params["batch_id"]
    _batch(service, batch_id, sees)
    if await asyncio.to_thread(service.store.set_status, batch_id, "cancelling", ("validating", "in_progress")):
        await service.cancel(batch_id)
    return _ok(batch_object(_batch(service, batch_id, sees)))


UPLOAD_SCHEMA = {
    "type": "object",
    "required": ["purpose", "file"],
    "properties": {
        "purpose": {"type": "string", "enum": ["batch"]},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "minimum": MIN_EXPIRES_S, "maximum": MAX_EXPIRES_S},
        "file": {"type": "string", "format": "binary", "description": "JSONL, one batch request per line"},
    },
}


def batch_routes(settings: ApiSettings) -> list[HTTPRouteHandler]:
    """The Files and Batches API's routes, documented with every status they send."""
    keys = bool(settings.api_keys)

    def responses(ok: str, tp: Any, *errors: tuple[str, str]) -> dict[str, Any]:
        out = {"200": {"description": ok, "content": {"application/json": {"schema": json_schema(tp)}}}}
        error = {"application/json": {"schema": json_schema(ApiError)}}
        refused = ("507", "the store cannot write now (its disk is full or read-only); retry")
        for code, what in (*errors, refused, *((("401", "wrong API key"), ("403", "no API key")) if keys else ())):
            out[code] = {"description": what, "content": error}
        return out

    content_responses = responses("the file's bytes", FileObject, ("404", "no such file"))
    content_responses["200"] = {
        "description": "the file's bytes (JSONL)",
        "content": {JSONL: {"schema": {"type": "string"}}},
    }
    no_file, no_batch = ("404", "no such file"), ("404", "no such batch")
    on_every_route: dict[str, Any] = {"tags": ["batches"], "exception_handlers": STORE_REFUSALS}
    return [
        post(
            "/v1/files",
            operation_class=documented(
                responses(
                    "the stored file",
                    FileObject,
                    ("400", "a malformed form or file (empty, too many lines, a custom_id twice, not JSONL)"),
                    ("413", "the file is over the upload limit"),
                    ("415", "not multipart/form-data"),
                    ("529", "over `max_transit_bytes` of bodies being received: retry after a short delay"),
                ),
                UPLOAD_SCHEMA,
                keys,
                media_type="multipart/form-data",
            ),
            summary="Upload a batch input file (JSONL)",
            **on_every_route,
            status_code=200,
            request_max_body_size=None,  # the upload limit is checked while the stream is read
        )(upload),
        get(
            "/v1/files",
            operation_class=documented(
                responses("one page of files, newest first", FileList, ("400", "a bad limit or purpose")), secured=keys
            ),
            summary="List files",
            **on_every_route,
        )(list_files),
        get(
            "/v1/files/{file_id:str}",
            operation_class=documented(responses("the file", FileObject, no_file), secured=keys),
            summary="Retrieve a file",
            **on_every_route,
        )(get_file),
        delete(
            "/v1/files/{file_id:str}",
            operation_class=documented(responses("deleted", DeletedFile, no_file), secured=keys),
            summary="Delete a file",
            **on_every_route,
            status_code=200,
        )(delete_file),
        get(
            "/v1/files/{file_id:str}/content",
            operation_class=documented(content_responses, secured=keys),
            summary="Download a file's content",
            **on_every_route,
        )(file_content),
        post(
            "/v1/batches",
            operation_class=documented(
                responses(
                    "the batch (new, or the one this Idempotency-Key created)",
                    BatchObject,
                    ("400", "a bad body, or an input file that is not a batch input"),
                    ("404", "no such input file"),
                    ("409", "this Idempotency-Key was used for a batch with other data"),
                    ("429", "too many batches in progress"),
                ),
                json_schema(CreateBatch),
                keys,
            ),
            summary="Create a batch",
            **on_every_route,
            status_code=200,
        )(create_batch),
        get(
            "/v1/batches",
            operation_class=documented(
                responses("one page of batches, newest first", BatchList, ("400", "a bad limit")), secured=keys
            ),
            summary="List batches",
            **on_every_route,
        )(list_batches),
        get(
            "/v1/batches/{batch_id:str}",
            operation_class=documented(responses("the batch", BatchObject, no_batch), secured=keys),
            summary="Retrieve a batch",
            **on_every_route,
        )(get_batch),
        post(
            "/v1/batches/{batch_id:str}/cancel",
            operation_class=documented(
                responses("the batch (cancelling; a terminal one unchanged)", BatchObject, no_batch), secured=keys
            ),
            summary="Cancel a batch",
            **on_every_route,
            status_code=200,
        )(cancel_batch),
    ]
