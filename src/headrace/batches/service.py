"""The Batch API's operations for one tenant at a time (the HTTP routes are thin over these):
files uploaded, read, listed, deleted; batches created, read, listed, cancelled.

Every lookup is by id *and* tenant: another tenant's file or batch is answered exactly as one
that does not exist (404), so that ids cannot be probed. The admin (tenant None) may read,
list and cancel any tenant's batch.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from headrace.batches.lines import ENDPOINTS, InputError, parse_input
from headrace.batches.objects import batch_object, file_object
from headrace.batches.runner import BatchRunner, Execute
from headrace.batches.store import BatchStore, Row
from headrace.config import BatchConfig
from headrace.paths import state_root

WINDOW_S = {"24h": 24 * 3600}
MAX_METADATA = 16  # OpenAI's limit: 16 pairs, keys <= 64 and values <= 512 characters


class BatchError(Exception):
    """A refusal the routes answer with `status` (400, 404, 413) and the parameter named."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def batch_dir(cfg: BatchConfig) -> Path:
    return Path(cfg.batch_dir) if cfg.batch_dir else state_root() / "batches"


class Batches:
    def __init__(self, cfg: BatchConfig, execute: Execute, max_line_bytes: int) -> None:
        """`max_line_bytes`: the server's request body limit, which each line must keep."""
        self.cfg = cfg
        self.max_line_bytes = max_line_bytes
        self.store = BatchStore(batch_dir(cfg))
        self.runner = BatchRunner(self.store, execute, cfg.batch_concurrency)

    async def close(self) -> None:
        await self.runner.stop()
        await asyncio.to_thread(self.store.close)

    # -- files ---------------------------------------------------------------------------

    async def upload(self, tenant: str, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        if purpose != "batch":
            raise BatchError(400, 'purpose must be "batch" (the only one served)', "purpose")
        if len(data) > self.cfg.batch_max_file_bytes:
            limit = self.cfg.batch_max_file_bytes
            raise BatchError(413, f"the file is larger than the limit of {limit} bytes", "file")
        try:
            parse_input(data, self.cfg.batch_max_lines, self.max_line_bytes)
        except InputError as e:
            raise BatchError(400, str(e), "file") from e
        row = await asyncio.to_thread(self.store.add_file, tenant, filename, purpose, data)
        return file_object(row)

    async def file(self, tenant: str, file_id: str) -> dict[str, Any]:
        return file_object(await self._file(tenant, file_id))

    async def content(self, tenant: str, file_id: str) -> bytes:
        await self._file(tenant, file_id)
        return await asyncio.to_thread(self.store.content, file_id)

    async def files(self, tenant: str, purpose: str | None) -> dict[str, Any]:
        rows = await asyncio.to_thread(self.store.files, tenant, purpose)
        return {"object": "list", "data": [file_object(r) for r in rows], "has_more": False}

    async def delete(self, tenant: str, file_id: str) -> dict[str, Any]:
        if not await asyncio.to_thread(self.store.delete_file, file_id, tenant):
            raise _no_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def _file(self, tenant: str, file_id: str, param: str | None = None) -> Row:
        row = await asyncio.to_thread(self.store.file, file_id, tenant)
        if row is None:
            raise _no_file(file_id, param)
        return row

    # -- batches -------------------------------------------------------------------------

    async def create(
        self, tenant: str, request: dict[str, Any], key_id: str | None = None
    ) -> dict[str, Any]:
        """A batch of `request["input_file_id"]`, started; `key_id`: the key that made it (its
        lines' ledger records name it)."""
        endpoint, window = request.get("endpoint"), request.get("completion_window")
        if endpoint not in ENDPOINTS:
            raise BatchError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", "endpoint")
        if window not in WINDOW_S:
            raise BatchError(400, 'completion_window must be "24h"', "completion_window")
        metadata = _metadata(request.get("metadata"))
        file_id = request.get("input_file_id")
        if not isinstance(file_id, str):
            raise BatchError(400, "input_file_id must be a file's id", "input_file_id")
        row = await self._file(tenant, file_id, "input_file_id")
        if row["purpose"] != "batch":
            raise BatchError(400, 'the input file\'s purpose is not "batch"', "input_file_id")
        data = await asyncio.to_thread(self.store.content, file_id)
        try:  # checked at upload already, maybe under other limits
            lines = parse_input(data, self.cfg.batch_max_lines)
        except InputError as e:
            raise BatchError(400, str(e), "input_file_id") from e
        wrong = next((x for x in lines if x.url != endpoint), None)
        if wrong is not None:
            message = f"line {wrong.index + 1}: url {wrong.url} is not the batch's endpoint"
            raise BatchError(400, message, "input_file_id")
        now = int(time.time())
        fields = {"tenant": tenant, "key_id": key_id, "endpoint": endpoint,
                  "input_file_id": file_id, "completion_window": window, "metadata": metadata,
                  "total": len(lines),
                  "created_at": now, "expires_at": now + WINDOW_S[str(window)]}  # fmt: skip
        batch = await asyncio.to_thread(self.store.add_batch, fields)
        self.runner.start(batch["id"])
        return batch_object(batch)

    async def batch(self, tenant: str | None, batch_id: str) -> dict[str, Any]:
        """The batch, if it is `tenant`'s (None: the admin's, any tenant's)."""
        row = await asyncio.to_thread(self.store.batch, batch_id, tenant)
        if row is None:
            raise BatchError(404, f"no batch {batch_id!r}", "batch_id")
        return batch_object(row)

    async def batches(self, tenant: str | None, limit: int, after: str | None) -> dict[str, Any]:
        if not 1 <= limit <= 100:
            raise BatchError(400, "limit must be in 1..100", "limit")
        rows = await asyncio.to_thread(self.store.batches, tenant)
        ids = [r["id"] for r in rows]
        start = ids.index(after) + 1 if after in ids else 0
        page = [batch_object(r) for r in rows[start : start + limit]]
        return {
            "object": "list", "data": page, "has_more": start + limit < len(rows),
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }  # fmt: skip

    async def cancel(self, tenant: str | None, batch_id: str) -> dict[str, Any]:
        await self.batch(tenant, batch_id)  # 404 unless the tenant's
        await self.runner.cancel(batch_id)
        return await self.batch(tenant, batch_id)


def _no_file(file_id: str, param: str | None = None) -> BatchError:
    return BatchError(404, f"no file {file_id!r}", param or "file_id")


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    ok = isinstance(value, dict) and len(value) <= MAX_METADATA
    ok = ok and all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
        for k, v in value.items()
    )
    if not ok:
        raise BatchError(
            400, f"metadata must be at most {MAX_METADATA} string pairs "
            "(keys up to 64 characters, values up to 512)", "metadata",
        )  # fmt: skip
    return dict(value)
