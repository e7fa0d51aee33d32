"""Wire types of the Files and Batches API (the shapes basal-client 0.6.0 reads), in the wire's field order."""

from __future__ import annotations

from typing import Literal

import msgspec

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
MIN_EXPIRES_S, MAX_EXPIRES_S = 3600, 2_592_000  # an expires_after's seconds: one hour to thirty days


class FileObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"] = "processed"
    status_details: None = None


class FileList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedFile(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: Literal[True] = True


class RequestCounts(msgspec.Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class BatchErrorEntry(msgspec.Struct, kw_only=True):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchErrorEntry]


class BatchObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ExpiresAfter(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    anchor: Literal["created_at"]
    seconds: int


class CreateBatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v1/batches: only `/v1/basal` and `24h` are served."""

    input_file_id: str
    endpoint: Literal["/v1/basal"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str


class ApiError(msgspec.Struct, kw_only=True):
    """Every refusal of these routes, as an OpenAI-Batch user reads it: `{"error": {message, type, param, code}}`."""

    error: ErrorDetail
