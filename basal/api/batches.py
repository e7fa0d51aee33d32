"""The Files and Batches API (docs/batches.md): the routes that basal-client's `files` and `batches` call.

Uploads are read from the ASGI stream straight into a temporary file in the store (never whole in memory before
the size check), as `multipart/form-data` with the fields first and the `file` part last, as the SDK sends them.
Every refusal is `{"error": {message, type, param, code}}`, the shape an OpenAI-Batch user expects.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.response import File

from basal.api.batch_types import (
    MAX_EXPIRES_S,
    MIN_EXPIRES_S,
    ApiError,
    BatchErrors,
    BatchList,
    BatchObject,
    CreateBatch,
    DeletedFile,
    ErrorDetail,
    FileList,
    FileObject,
    RequestCounts,
)
from basal.api.decisions import ApiSettings, check_auth
from basal.api.errors import ClientGone
from basal.api.openapi import documented, json_schema
from basal.batch.lines import UploadRefused
from basal.batch.service import WINDOW_S, BatchService, lines_of
from basal.batch.store import Conflict, TooMany, Unavailable
from basal.core.errors import RequestError

MAX_LIST = 100  # one page of a list, at most (OpenAI's batch list limit)
DEFAULT_LIST = 20
MAX_FORM_HEAD = 64 << 10  # bytes of form fields and part headers before the file's bytes
MAX_METADATA = 16  # metadata pairs; keys up to 64 characters, values up to 512 (as OpenAI)
JSONL = "application/jsonl"


class Refused(Exception):
    """A refusal of these routes: status, code, message, and the parameter it is about."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


def _refusal(e: Refused) -> Response:
    kind = {
        401: "authentication_error",
        403: "authentication_error",
        404: "not_found_error",
        409: "conflict_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        503: "server_error",
    }.get(e.status, "invalid_request_error")
    body = ApiError(error=ErrorDetail(message=e.message, type=kind, param=e.param, code=e.code))
    return Response(msgspec.json.encode(body), status_code=e.status, media_type="application/json")


def _auth(request: Request, settings: ApiSettings) -> None:
    try:
        check_auth(request, settings, "basal")
    except RequestError as e:
        raise Refused(e.status, "invalid_api_key", e.body["error"]) from None


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


def _list_args(request: Request) -> tuple[str | None, int]:
    after = request.query_params.get("after")
    raw = request.query_params.get("limit")
    if raw is None:
        return after, DEFAULT_LIST
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST:
        raise Refused(400, "invalid_limit", f"limit must be a whole number from 1 to {MAX_LIST}", "limit")
    return after, int(raw)


def _page(kind: type[FileList] | type[BatchList], data: list, more: bool) -> FileList | BatchList:
    """One page of a list endpoint: its items, the ids at both ends (the cursor for `after`), whether more follow."""
    return kind(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=more)


def _ok(value: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json")


def _expires_seconds(value: Any, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_EXPIRES_S <= value <= MAX_EXPIRES_S:
        raise Refused(400, "invalid_expires_after", f"{param} must be {MIN_EXPIRES_S} to {MAX_EXPIRES_S}", param)
    return value


# the upload's form


def _boundary(content_type: str) -> bytes:
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "multipart/form-data":
        raise Refused(415, "invalid_content_type", "send the file as multipart/form-data (fields, then `file`)")
    match = re.search(r'boundary="?([^";]{1,200})"?', params)
    if not match:
        raise Refused(400, "invalid_multipart", "the multipart/form-data Content-Type has no boundary")
    return match.group(1).encode("latin-1")


def _part_headers(raw: bytes) -> tuple[str, str | None]:
    """(field name, filename or None) of one part's headers."""
    text = raw.decode("utf-8", "replace")
    match = re.search(r"content-disposition:\s*form-data;([^\r\n]*)", text, re.IGNORECASE)
    if not match:
        raise Refused(400, "invalid_multipart", "a form part lacks Content-Disposition: form-data")
    params = match.group(1)
    name = re.search(r'(?:^|;)\s*name="([^"]*)"', params)
    filename = re.search(r';\s*filename="([^"]*)"', params)
    if not name:
        raise Refused(400, "invalid_multipart", "a form part has no name")
    return name.group(1), (filename.group(1) if filename else None)


def _check_filename(name: str) -> str:
    raw = name.encode("utf-8", "surrogateescape")
    if not 1 <= len(raw) <= 255 or any(c in '"\\' or unicodedata.category(c) == "Cc" for c in name):
        raise Refused(
            400,
            "invalid_filename",
            "filename must have 1-255 UTF-8 bytes, without control characters, quotes or backslashes",
            "file",
        )
    return name


async def _read_upload(request: Request, limit: int, tmp: Path) -> tuple[dict[str, str], str]:
    """Stream the form into `tmp`: -> (fields, filename). The file part must come last; its bytes are written as
    they arrive and refused (413) once over `limit`."""
    boundary = _boundary(request.headers.get("content-type", ""))
    delimiter = b"\r\n--" + boundary
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + MAX_FORM_HEAD:
        raise Refused(413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file")
    buffer = b"\r\n"  # the first delimiter has no CRLF before it
    fields: dict[str, str] = {}
    filename = None
    stream = _chunks(request)
    async for chunk in stream:  # fields, then the file part's headers
        buffer += chunk
        while filename is None:
            start = buffer.find(delimiter)
            if start < 0:
                break
            head_end = buffer.find(b"\r\n\r\n", start)
            if head_end < 0:
                break
            name, fname = _part_headers(buffer[start + len(delimiter) : head_end])
            body_start = head_end + 4
            if fname is not None:
                if name != "file":
                    raise Refused(400, "invalid_multipart", "the file part must be named `file`", "file")
                filename, buffer = _check_filename(fname), buffer[body_start:]
                break
            end = buffer.find(delimiter, body_start)
            if end < 0:
                break
            fields[name] = buffer[body_start:end].decode("utf-8", "replace")
            buffer = buffer[end:]
        if filename is not None:
            break
        if len(buffer) > MAX_FORM_HEAD:
            raise Refused(400, "invalid_multipart", "the form's fields are over 64 KiB, or it has no `file` part")
    if filename is None:
        raise Refused(400, "missing_file", "the form has no `file` part (send the fields first, then `file`)", "file")
    keep = len(delimiter) + 8  # a delimiter split over two chunks is found in the kept tail
    size = 0
    with open(tmp, "wb") as out:
        tail = buffer
        async for chunk in stream:
            tail += chunk
            if len(tail) > keep:
                out.write(tail[:-keep])
                size += len(tail) - keep
                tail = tail[-keep:]
                if size > limit:
                    raise Refused(413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file")
        end = tail.find(delimiter)
        if end < 0:
            # the delimiter may straddle what was already written: look in the file's end too
            out.flush()
            raise Refused(400, "invalid_multipart", "the form does not end with its closing boundary", "file")
        out.write(tail[:end])
        size += end
        if size > limit:
            raise Refused(413, "file_too_large", f"the file is over the upload limit of {limit} bytes", "file")
        if not tail[end + len(delimiter) :].startswith(b"--"):
            raise Refused(400, "invalid_multipart", "the `file` part must be the form's last part", "file")
        out.flush()
        os.fsync(out.fileno())
    return fields, filename


async def _chunks(request: Request):
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def batch_routes(service: BatchService, settings: ApiSettings) -> list:
    """The route handlers of the Files and Batches API around one service (its store and its runner)."""
    store, limits = service.store, service.settings
    keys = bool(settings.api_keys)

    def responses(ok: str, tp: Any, *errors: tuple[str, str], status: str = "200") -> dict[str, Any]:
        out = {status: {"description": ok, "content": {"application/json": {"schema": json_schema(tp)}}}}
        error = {"application/json": {"schema": json_schema(ApiError)}}
        for code, what in (*errors, *((("401", "wrong API key"), ("403", "no API key")) if keys else ())):
            out[code] = {"description": what, "content": error}
        return out

    async def guarded(request: Request, work) -> Response:
        try:
            _auth(request, settings)
            return await work()
        except Refused as e:
            return _refusal(e)
        except Unavailable:  # the shared database restarts: the caller retries
            return _refusal(Refused(503, "store_unavailable", "the batch store's database is unavailable; retry"))

    upload_schema = {
        "type": "object",
        "required": ["purpose", "file"],
        "properties": {
            "purpose": {"type": "string", "enum": ["batch"]},
            "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
            "expires_after[seconds]": {"type": "integer", "minimum": MIN_EXPIRES_S, "maximum": MAX_EXPIRES_S},
            "file": {"type": "string", "format": "binary", "description": "JSONL, one batch request per line"},
        },
    }

    @post(
        "/v1/files",
        operation_class=documented(
            responses(
                "the stored file",
                FileObject,
                ("400", "a malformed form or file (empty, too many lines, a custom_id twice, not JSONL)"),
                ("413", "the file is over the upload limit"),
                ("415", "not multipart/form-data"),
            ),
            upload_schema,
            keys,
            media_type="multipart/form-data",
        ),
        summary="Upload a batch input file (JSONL)",
        tags=["batches"],
        status_code=200,
        request_max_body_size=None,  # the upload limit is checked while the stream is read
    )
    async def upload(request: Request) -> Response:
        async def work() -> Response:
            tmp = store.upload_path()
            try:
                fields, filename = await _read_upload(request, limits.max_upload_bytes, tmp)
                if fields.get("purpose") != "batch":
                    raise Refused(400, "invalid_purpose", 'purpose must be "batch"', "purpose")
                expires = None
                if "expires_after[anchor]" in fields or "expires_after[seconds]" in fields:
                    if fields.get("expires_after[anchor]") != "created_at":
                        raise Refused(
                            400, "invalid_expires_after", 'expires_after[anchor] must be "created_at"', "expires_after"
                        )
                    seconds = fields.get("expires_after[seconds]", "")
                    expires = _expires_seconds(int(seconds) if seconds.isdigit() else -1, "expires_after[seconds]")
                try:
                    parsed = await asyncio.to_thread(lambda: lines_of(tmp.read_bytes(), limits))
                except UploadRefused as e:
                    raise Refused(400, "invalid_file", str(e), "file") from None
                row = await asyncio.to_thread(store.add_file, tmp, filename, "batch", expires, len(parsed))
                return _ok(file_object(row))
            except ClientGone:
                return Response(b"", status_code=499)
            finally:
                tmp.unlink(missing_ok=True)

        return await guarded(request, work)

    @get(
        "/v1/files",
        operation_class=documented(
            responses("one page of files, newest first", FileList, ("400", "a bad limit or purpose")), secured=keys
        ),
        summary="List files",
        tags=["batches"],
    )
    async def list_files(request: Request) -> Response:
        async def work() -> Response:
            after, limit = _list_args(request)
            purpose = request.query_params.get("purpose")
            if purpose is not None and purpose not in ("batch", "batch_output"):
                raise Refused(400, "invalid_purpose", 'purpose must be "batch" or "batch_output"', "purpose")
            rows, more = store.list_files(after, limit, purpose)
            return _ok(_page(FileList, [file_object(r) for r in rows], more))

        return await guarded(request, work)

    def _file(file_id: str) -> dict:
        row = store.get_file(file_id)
        if row is None:
            raise Refused(404, "file_not_found", f"no file {file_id!r}", "file_id")
        return row

    @get(
        "/v1/files/{file_id:str}",
        operation_class=documented(responses("the file", FileObject, ("404", "no such file")), secured=keys),
        summary="Retrieve a file",
        tags=["batches"],
    )
    async def get_file(request: Request) -> Response:
        file_id = request.path_params["file_id"]

        async def work() -> Response:
            return _ok(file_object(_file(file_id)))

        return await guarded(request, work)

    @delete(
        "/v1/files/{file_id:str}",
        operation_class=documented(responses("deleted", DeletedFile, ("404", "no such file")), secured=keys),
        summary="Delete a file",
        tags=["batches"],
        status_code=200,
    )
    async def delete_file(request: Request) -> Response:
        file_id = request.path_params["file_id"]

        async def work() -> Response:
            _file(file_id)
            await asyncio.to_thread(store.delete_file, file_id)
            return _ok(DeletedFile(id=file_id))

        return await guarded(request, work)

    content_responses = responses("the file's bytes", FileObject, ("404", "no such file"))
    content_responses["200"] = {
        "description": "the file's bytes (JSONL)",
        "content": {JSONL: {"schema": {"type": "string"}}},
    }

    @get(
        "/v1/files/{file_id:str}/content",
        operation_class=documented(content_responses, secured=keys),
        summary="Download a file's content",
        tags=["batches"],
    )
    async def file_content(request: Request) -> Response | File:
        file_id = request.path_params["file_id"]

        async def work() -> Response | File:
            _file(file_id)
            path = store.file_path(file_id)
            if not path.exists():
                raise Refused(404, "file_not_found", f"no file {file_id!r}", "file_id")
            return File(path, media_type=JSONL, content_disposition_type="inline", filename=f"{file_id}.jsonl")

        return await guarded(request, work)  # type: ignore[arg-type]

    @post(
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
        tags=["batches"],
        status_code=200,
    )
    async def create_batch(request: Request) -> Response:
        async def work() -> Response:
            key = request.headers.get("idempotency-key")
            if key is not None and (not 1 <= len(key) <= 128 or any(not "!" <= c <= "~" for c in key)):
                raise Refused(
                    400, "invalid_idempotency_key", "Idempotency-Key must have 1-128 visible ASCII characters"
                )
            raw = await request.body()
            try:
                body = msgspec.json.decode(raw, type=CreateBatch)
            except msgspec.ValidationError as e:
                raise Refused(400, "invalid_request", f"the body does not validate: {e}") from None
            except msgspec.DecodeError as e:
                raise Refused(400, "invalid_json", f"the body is not JSON: {e}") from None
            if body.metadata is not None and (
                len(body.metadata) > MAX_METADATA or any(len(k) > 64 or len(v) > 512 for k, v in body.metadata.items())
            ):
                raise Refused(
                    400, "invalid_metadata", "metadata: at most 16 pairs, keys up to 64, values up to 512", "metadata"
                )
            expires = None
            if body.output_expires_after is not None:
                expires = _expires_seconds(body.output_expires_after.seconds, "output_expires_after.seconds")
            file = store.get_file(body.input_file_id)
            if file is None:
                raise Refused(404, "file_not_found", f"no file {body.input_file_id!r}", "input_file_id")
            if file["purpose"] != "batch":
                raise Refused(400, "invalid_input_file", "the input file's purpose must be batch", "input_file_id")
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
                )
            except Conflict:
                raise Refused(
                    409, "idempotency_conflict", "this Idempotency-Key was used for a batch with other data"
                ) from None
            except TooMany:
                raise Refused(
                    429, "too_many_batches", f"{limits.max_active} batches are in progress; retry when one ends"
                ) from None
            service.wake()
            return _ok(batch_object(row))

        return await guarded(request, work)

    @get(
        "/v1/batches",
        operation_class=documented(
            responses("one page of batches, newest first", BatchList, ("400", "a bad limit")), secured=keys
        ),
        summary="List batches",
        tags=["batches"],
    )
    async def list_batches(request: Request) -> Response:
        async def work() -> Response:
            after, limit = _list_args(request)
            rows, more = store.list_batches(after, limit)
            return _ok(_page(BatchList, [batch_object(r) for r in rows], more))

        return await guarded(request, work)

    def _batch(batch_id: str) -> dict:
        row = store.get_batch(batch_id)
        if row is None:
            raise Refused(404, "batch_not_found", f"no batch {batch_id!r}", "batch_id")
        return row

    @get(
        "/v1/batches/{batch_id:str}",
        operation_class=documented(responses("the batch", BatchObject, ("404", "no such batch")), secured=keys),
        summary="Retrieve a batch",
        tags=["batches"],
    )
    async def get_batch(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]

        async def work() -> Response:
            return _ok(batch_object(_batch(batch_id)))

        return await guarded(request, work)

    @post(
        "/v1/batches/{batch_id:str}/cancel",
        operation_class=documented(
            responses("the batch (cancelling; a terminal one unchanged)", BatchObject, ("404", "no such batch")),
            secured=keys,
        ),
        summary="Cancel a batch",
        tags=["batches"],
        status_code=200,
    )
    async def cancel_batch(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]

        async def work() -> Response:
            _batch(batch_id)
            if await asyncio.to_thread(store.set_status, batch_id, "cancelling", ("validating", "in_progress")):
                await service.cancel(batch_id)
            return _ok(batch_object(_batch(batch_id)))

        return await guarded(request, work)

    return [
        upload,
        list_files,
        get_file,
        delete_file,
        file_content,
        create_batch,
        list_batches,
        get_batch,
        cancel_batch,
    ]
