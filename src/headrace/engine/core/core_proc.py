"""An engine core in its own process ('spawn'), talking to the front end over ZeroMQ.

Two PUSH/PULL pairs of ipc:// sockets in a private temp dir carry the messages of `messages`,
as MessagePack. The front end binds both, so a core that dies and a new one that starts later
need nothing but a new process; the front end learns of a death at once from the process
sentinel. Neither side drops a message when the other is slow (`core_link`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections import deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from headrace.engine.core.core_link import (
    FRONT_END_STUCK_EXIT,
    CoreBusyError,
    CoreLink,
    FrontEndStuckError,
)
from headrace.engine.core.core_loop import CoreSpec, run_core_loop
from headrace.engine.messages import (
    CoreFailed,
    EngineCoreRequest,
    FromCore,
    Shutdown,
    ToCore,
    decode_from_core,
    decode_to_core,
    encode,
)

log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 5.0
_FLUSH_POLL_S = (0.001, 0.05)  # a full inbox is retried this often, backing off


def core_process_main(
    spec: CoreSpec,
    served_model_name: str | None,
    in_addr: str,
    out_addr: str,
    parent_pid: int,
    link: CoreLink | None = None,
) -> None:
    """Entry point of the core process: load the model, report ready, serve until told; then
    leave at once. An interpreter that imported torch takes 0.4 s to tear itself down here
    (freeing modules; no atexit work of ours), which every stop and restart of a server waited
    for: with the sockets closed and the logs flushed, nothing is left that needs it."""
    try:
        _serve(spec, served_model_name, in_addr, out_addr, parent_pid, link)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _serve(
    spec: CoreSpec,
    served_model_name: str | None,
    in_addr: str,
    out_addr: str,
    parent_pid: int,
    link: CoreLink | None,
) -> None:
    _settle_process(spec)
    link = link or CoreLink()
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    link.receiver(inbox)
    inbox.connect(in_addr)
    outbox = ctx.socket(zmq.PUSH)
    link.sender(outbox)
    outbox.setsockopt(zmq.SNDTIMEO, int(link.out_timeout_s * 1000))
    outbox.connect(out_addr)
    send = _sender(outbox, link)
    try:
        try:
            core = spec.build()
        except BaseException:
            send(CoreFailed(traceback.format_exc()))
            return
        send(core.ready_message(served_model_name))
        recv = _receiver(inbox)
        run_core_loop(core, recv, send, should_stop=lambda: os.getppid() != parent_pid)
    except FrontEndStuckError as e:
        log.error("%s: the engine core stops", e)
        raise SystemExit(FRONT_END_STUCK_EXIT) from None
    finally:
        outbox.close(linger=1000)
        inbox.close(linger=0)
        ctx.term()


def _settle_process(spec: CoreSpec) -> None:
    """Signals, priority and logging of the core process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end decides when we stop
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a hangup to the group reloads the front end
    if spec.model_config.engine_nice:
        # Model steps can take every core; a refusal or /health must not wait behind them.
        os.nice(spec.model_config.engine_nice)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s core %(levelname)s: %(message)s")
    # The runner's load-time choices (KV blocks, int8 projections): a few lines a start, and
    # the only place a server's log says which kernels it took.
    logging.getLogger("headrace.engine.runner.model_runner").setLevel(logging.INFO)


def _sender(outbox: zmq.Socket[bytes], link: CoreLink) -> Callable[[FromCore], None]:
    def send(msg: FromCore) -> None:
        try:
            outbox.send(encode(msg))
        except zmq.Again:
            raise FrontEndStuckError(
                f"the front end took no output for {link.out_timeout_s:g} s"
            ) from None

    return send


def _receiver(inbox: zmq.Socket[bytes]) -> Callable[[float], list[ToCore]]:
    def recv(timeout: float) -> list[ToCore]:
        msgs: list[ToCore] = []
        if inbox.poll(int(timeout * 1000)):
            with contextlib.suppress(zmq.Again):
                while True:
                    data = inbox.recv(zmq.NOBLOCK)
                    try:
                        msgs.append(decode_to_core(data))
                    except Exception:  # one unreadable message must not end the core
                        log.exception("engine core got an unreadable message")
        return msgs

    return recv


class ProcessCore:
    """The front end's side of a core process."""

    def __init__(
        self, spec: CoreSpec, served_model_name: str | None = None, link: CoreLink | None = None
    ) -> None:
        self.spec = spec
        self.served_model_name = served_model_name
        self.link = link or CoreLink()
        self.proc: multiprocessing.process.BaseProcess | None = None
        self._dir = tempfile.mkdtemp(prefix="headrace-core-")
        self._sync_ctx = zmq.Context()
        self._async_ctx = zmq.asyncio.Context()
        self._inbox = self._sync_ctx.socket(zmq.PUSH)  # the core's inbox
        self.link.sender(self._inbox)
        self._outbox = self._async_ctx.socket(zmq.PULL)  # the core's outbox
        self.link.receiver(self._outbox)
        self._recv_task: asyncio.Task[None] | None = None
        self._pending: deque[bytes] = deque()  # what the core's full inbox did not take yet
        self._flush_task: asyncio.Task[None] | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(
        self, on_message: Callable[[FromCore], None], on_death: Callable[[str], None]
    ) -> None:
        in_addr = f"ipc://{self._dir}/in"
        out_addr = f"ipc://{self._dir}/out"
        self._inbox.bind(in_addr)
        self._outbox.bind(out_addr)
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(
            target=core_process_main,
            args=(self.spec, self.served_model_name, in_addr, out_addr, os.getpid(), self.link),
            name="headrace-engine-core",
            daemon=True,
        )
        self.proc.start()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.proc.sentinel, self._on_exit, on_death)
        self._recv_task = asyncio.create_task(self._receive(on_message))

    @property
    def num_pending(self) -> int:
        """Messages waiting for room in the core's inbox."""
        return len(self._pending)

    def send(self, msg: ToCore) -> None:
        """Sent now, or queued in order behind what waits already; raises CoreBusyError for
        a new request when `link.pending_limit` messages wait."""
        if self._closing or not self.is_alive:
            return
        data = encode(msg)
        if not self._pending and self._try_send(data):
            return
        if isinstance(msg, EngineCoreRequest) and len(self._pending) >= self.link.pending_limit:
            log.warning(
                "refusing a request: %d messages wait for the engine core", len(self._pending)
            )
            raise CoreBusyError("the engine core is not taking requests; try again later")
        if not self._pending:
            log.warning("the engine core's inbox is full: holding messages until it reads")
        self._pending.append(data)
        if self._flush_task is None or self._flush_task.done():
            assert self._loop is not None
            self._flush_task = self._loop.create_task(self._flush())

    def _try_send(self, data: bytes) -> bool:
        try:
            self._inbox.send(data, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    async def _flush(self) -> None:
        """Send what waits, in order, as fast as the core takes it."""
        delay = _FLUSH_POLL_S[0]
        while self._pending:
            if self._try_send(self._pending[0]):
                self._pending.popleft()
                delay = _FLUSH_POLL_S[0]
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _FLUSH_POLL_S[1])

    async def close(self) -> None:
        if self._closing:
            return
        self.send(Shutdown())
        self._closing = True
        proc = self.proc
        if proc is not None:
            self._remove_reader()
            await asyncio.to_thread(proc.join, _SHUTDOWN_GRACE_S)
            if proc.is_alive():
                log.warning("engine core did not stop in %.0f s; killing it", _SHUTDOWN_GRACE_S)
                proc.kill()
                await asyncio.to_thread(proc.join, _SHUTDOWN_GRACE_S)
        for task in (self._recv_task, self._flush_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._pending.clear()
        self._inbox.close(linger=0)
        self._outbox.close(linger=0)
        self._sync_ctx.term()
        self._async_ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _receive(self, on_message: Callable[[FromCore], None]) -> None:
        while True:
            data = await self._outbox.recv()
            try:
                msg = decode_from_core(data)
            except Exception:
                log.exception("engine core sent an unreadable message")
                continue
            on_message(msg)

    def _on_exit(self, on_death: Callable[[str], None]) -> None:
        self._remove_reader()
        if self._closing:
            return
        assert self.proc is not None
        self.proc.join(0)
        self._pending.clear()  # nobody will read them: the front end fails every request
        on_death(f"the engine core process exited (code {self.proc.exitcode})")

    def _remove_reader(self) -> None:
        if self._loop is not None and self.proc is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.proc.sentinel)
