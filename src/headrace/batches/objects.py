"""OpenAI's `file` and `batch` objects, and the lines of a batch's output and error files, from
the store's records."""

from __future__ import annotations

import json
from typing import Any

from headrace.batches.store import Row, new_id

_STAMPS = (
    "created_at", "expires_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
    "cancelling_at", "cancelled_at",
)  # fmt: skip


def file_object(row: Row) -> dict[str, Any]:
    return {
        "id": row["id"], "object": "file", "bytes": row["bytes"],
        "created_at": row["created_at"], "filename": row["filename"], "purpose": row["purpose"],
        "status": "processed", "expires_at": None, "status_details": None,
    }  # fmt: skip


def batch_object(row: Row) -> dict[str, Any]:
    errors = json.loads(row["errors"]) if row["errors"] else None
    return {
        "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
        "status": row["status"], "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"], "expired_at": row["expired_at"],
        **{k: row[k] for k in _STAMPS},
        "request_counts": {
            "total": row["total"], "completed": row["completed"], "failed": row["failed"],
        },
        "metadata": json.loads(row["metadata"]) if row["metadata"] else None,
    }  # fmt: skip


def output_line(custom_id: str, status: int, body: Any) -> dict[str, Any]:
    """One request's outcome as OpenAI writes it: the response (any status), and for a failed
    one also `error` with the response's error code and message."""
    request_id = body.get("id") if isinstance(body, dict) and status < 400 else None
    line = {
        "id": new_id("batch_req_"), "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id or new_id("req_"),
                     "body": body},
        "error": None,
    }  # fmt: skip
    if status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        code = error.get("code") or error.get("type") or status
        line["error"] = {"code": str(code), "message": str(error.get("message") or body)}
    return line


EXPIRED = "batch_expired"


def expired_line(custom_id: str) -> dict[str, Any]:
    """A line the batch's window ended on before it ran (or while it was refused for now)."""
    message = "This line could not be executed before the completion window expired."
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
            "error": {"code": EXPIRED, "message": message}}  # fmt: skip


def is_expired(line: str) -> bool:
    error = json.loads(line).get("error")
    return isinstance(error, dict) and error.get("code") == EXPIRED


def batch_error(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    """An entry of a batch's `errors.data` (why it failed as a whole)."""
    return {"code": code, "message": message, "param": None, "line": line}
