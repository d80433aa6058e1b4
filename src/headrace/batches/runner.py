"""Runs batches in the background: each line through `execute` (the server's own route, on the
batch tier), a bounded number in flight over all batches, each finished line recorded at once.

A batch goes validating -> in_progress -> finalizing -> completed (its input unreadable:
failed; a line not answered within the window: expired, that line in the error file); a cancel
moves it to cancelling, stops its lines in flight, and ends it cancelled with the lines
finished so far. A line refused for now (429 a tenant's limit, 503 a full queue or a loading
server, a failed engine) waits and is tried again, backing off from half a second to 30 s,
until the batch's window ends: batch work fills the capacity left over, it does not fail for
the lack of it. A stopped server's batches are taken up again at start (`resume`): only the
lines with no record run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from headrace.batches.lines import InputError, InputLine, parse_input
from headrace.batches.objects import batch_error, expired_line, is_expired, output_line
from headrace.batches.store import BatchStore, Row

log = logging.getLogger("headrace.batches")
# (tenant, key id, url, body) -> (HTTP status, JSON body): one request as the route answers
# it, made as the tenant whose key (its id, for the ledger) made the batch.
Execute = Callable[[str, str | None, str, dict[str, Any]], Awaitable[tuple[int, Any]]]
RETRY = (429, 503)
MAX_RETRY_S = 30.0
ENDED = ("completed", "failed", "cancelled", "expired")


class BatchRunner:
    def __init__(
        self, store: BatchStore, execute: Execute, concurrency: int, retry_s: float = 0.5
    ) -> None:
        self.store = store
        self.execute = execute
        self.slots = asyncio.Semaphore(concurrency)
        self.retry_s = retry_s
        self.tasks: dict[str, asyncio.Task[None]] = {}  # batch id -> its run
        self.work: dict[str, asyncio.Future[Any]] = {}  # batch id -> its lines in flight
        self.cancelled: set[str] = set()  # cancelled here: their lines start no more
        self.lines_running = 0  # for the metrics: lines inside `execute` now
        self.lines_done = {"completed": 0, "failed": 0}  # lines finished since the start

    def start(self, batch_id: str) -> None:
        task = asyncio.create_task(self._run(batch_id), name=f"batch {batch_id}")
        self.tasks[batch_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(batch_id, None))

    def resume(self) -> int:
        """Take up every batch a stop left unfinished; how many."""
        rows = self.store.unfinished()
        for row in rows:
            log.info("resuming batch %s (%s)", row["id"], row["status"])
            self.start(row["id"])
        return len(rows)

    async def cancel(self, batch_id: str) -> None:
        """cancelling now; cancelled once its lines in flight have stopped."""
        ended = (*ENDED, "finalizing", "cancelling")
        moved = await asyncio.to_thread(self.store.set_status_unless, batch_id, "cancelling", ended)
        if not moved:
            return
        self.cancelled.add(batch_id)
        work = self.work.get(batch_id)
        if work is not None:
            work.cancel()
        elif batch_id not in self.tasks:  # not running here (it ended meanwhile): end it
            self.start(batch_id)

    async def stop(self) -> None:
        """The server stops: drop the runs (their unrecorded lines run again at the next start)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, batch_id: str) -> None:
        try:
            row = await asyncio.to_thread(self.store.batch, batch_id)
            assert row is not None
            if row["status"] != "cancelling":
                lines = await self._validate(row)
                if lines is None:
                    return
                await self._run_lines(row, lines)
            await self._finalize(batch_id)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or a broken disk: the batch fails, the server goes on
            log.exception("batch %s failed", batch_id)
            errors = json.dumps([batch_error("server_error", f"the batch failed: {e}")])
            await asyncio.to_thread(self.store.update, batch_id, status="failed", errors=errors)

    async def _validate(self, row: Row) -> list[InputLine] | None:
        """The input's lines, the batch in_progress; None (and the batch failed) if unusable."""
        try:
            data = await asyncio.to_thread(self.store.content, row["input_file_id"])
            lines = parse_input(data, max_lines=max(row["total"], 1))
            wrong = next((x for x in lines if x.url != row["endpoint"]), None)
            if wrong is not None:
                raise InputError(f"line {wrong.index + 1}: url is not the batch's endpoint")
        except (OSError, InputError) as e:
            errors = json.dumps([batch_error("invalid_input_file", str(e))])
            await asyncio.to_thread(self.store.update, row["id"], status="failed", errors=errors)
            return None
        if row["status"] == "validating":  # unless a cancel came meanwhile
            kept = (*ENDED, "cancelling")
            await asyncio.to_thread(self.store.set_status_unless, row["id"], "in_progress", kept)
        return lines

    async def _run_lines(self, row: Row, lines: list[InputLine]) -> None:
        done = await asyncio.to_thread(self.store.lines, row["id"])
        todo = [line for line in lines if line.index not in done]
        if row["id"] in self.cancelled:  # cancelled while it was being validated
            return
        work = asyncio.gather(*(self._line(row, line) for line in todo))
        self.work[row["id"]] = work
        try:
            await work
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the server stops, not a cancel
                raise
        finally:
            self.work.pop(row["id"], None)

    async def _line(self, row: Row, line: InputLine) -> None:
        answer = await self._answer(row, line)
        if answer is None:  # the batch's window ended before the line got its answer
            ok, result = False, expired_line(line.custom_id)
        else:
            ok, result = answer[0] < 400, output_line(line.custom_id, *answer)
        await asyncio.to_thread(self.store.finish_line, row["id"], line.index, ok, result)
        self.lines_done["completed" if ok else "failed"] += 1

    async def _answer(self, row: Row, line: InputLine) -> tuple[int, Any] | None:
        """The line's answer: tried again while refused for now; None once the window ends."""
        deadline = row["expires_at"] or float("inf")
        wait_s = self.retry_s
        while time.time() < deadline:
            async with self.slots:
                self.lines_running += 1
                try:
                    answer = await self.execute(row["tenant"], row["key_id"], line.url, line.body)
                finally:
                    self.lines_running -= 1
            if answer[0] not in RETRY:
                return answer
            await asyncio.sleep(min(wait_s, max(deadline - time.time(), 0.0)))
            wait_s = min(2 * wait_s, MAX_RETRY_S)  # a line that keeps failing costs little
        return None

    async def _finalize(self, batch_id: str) -> None:
        """Write the output and error files; completed, expired if a line's window ended
        before it ran, or cancelled after a cancel."""
        row = await asyncio.to_thread(self.store.batch, batch_id)
        assert row is not None
        cancelled = row["status"] == "cancelling"
        if not cancelled:
            await asyncio.to_thread(self.store.update, batch_id, status="finalizing")
        done = await asyncio.to_thread(self.store.lines, batch_id)
        files: dict[str, str | None] = {}
        for ok, name in ((True, "output"), (False, "error")):
            results = [text for _, (good, text) in sorted(done.items()) if good is ok]
            files[f"{name}_file_id"] = await self._write_file(row, name, results)
        expired = any(is_expired(text) for good, text in done.values() if not good)
        status = "cancelled" if cancelled else "expired" if expired else "completed"
        await asyncio.to_thread(self.store.update, batch_id, status=status, **files)

    async def _write_file(self, row: Row, name: str, results: list[str]) -> str | None:
        if not results:
            return None
        data = "".join(text + "\n" for text in results).encode()
        filename = f"{row['id']}_{name}.jsonl"
        made = await asyncio.to_thread(
            self.store.add_file, row["tenant"], filename, "batch_output", data
        )
        return str(made["id"])
