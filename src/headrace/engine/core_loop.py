"""The engine core's busy loop and the messages it exchanges with its front end.

Transport-agnostic: the loop is handed `recv(timeout)` and `send(msg)`; a process replica runs
it over ZeroMQ (`core_proc`), the in-process variant in a thread (`core_thread`). Messages are
plain picklable dataclasses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.engine_core import EngineCore, EngineCoreRequest, Runner
from headrace.engine.outputs import RequestOutput, StepStats
from headrace.engine.waiting_queue import WaitingQueue
from headrace.request import FinishReason

log = logging.getLogger(__name__)

IDLE_STATS_INTERVAL_S = 0.5  # an idle core still reports its stats this often
_STALLED_WAIT_S = 0.002  # work waiting but nothing schedulable (static batch timer, deadlines)

RunnerFactory = Callable[[ModelConfig, CacheConfig], Runner]
QueueFactory = Callable[[], WaitingQueue]


# -- front end -> core ---------------------------------------------------------------------


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True)
class Shutdown:
    pass


# -- core -> front end ---------------------------------------------------------------------


@dataclass(frozen=True)
class CoreReady:
    model_name: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    eos_token_ids: tuple[int, ...]
    tokenizer: Any  # headrace.loader.tokenizer.Tokenizer (picklable)


@dataclass(frozen=True)
class CoreFailed:
    error: str  # the model could not be loaded


@dataclass(frozen=True)
class CoreOutputs:
    outputs: list[RequestOutput]
    stats: StepStats


@dataclass(frozen=True)
class CoreSpec:
    """Everything needed to build a core, picklable for a spawned process."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    queue_factory: QueueFactory | None = None
    runner_factory: RunnerFactory | None = None  # default: the real ModelRunner

    def build(self) -> EngineCore:
        if self.runner_factory is None:
            from headrace.engine.model_runner import ModelRunner  # torch: only in the core

            runner: Runner = ModelRunner(self.model_config, self.cache_config)
        else:
            runner = self.runner_factory(self.model_config, self.cache_config)
        queue = self.queue_factory() if self.queue_factory is not None else None
        caching = self.cache_config.enable_prefix_caching
        return EngineCore(self.scheduler_config, runner, queue, enable_prefix_caching=caching)


def ready_message(core: EngineCore, served_model_name: str | None) -> CoreReady:
    runner: Any = core.runner
    return CoreReady(
        model_name=served_model_name or str(getattr(runner, "model_name", None) or "model"),
        max_model_len=core.max_model_len,
        num_kv_blocks=core.block_manager.num_blocks,
        block_size=core.block_manager.block_size,
        eos_token_ids=core.eos_token_ids,
        tokenizer=getattr(runner, "tokenizer", None),
    )


def run_core_loop(
    core: EngineCore,
    recv: Callable[[float], list[object]],
    send: Callable[[object], None],
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Step while there is work, take messages between steps, report after every step.

    `recv(timeout)` returns the messages that arrived (waiting up to `timeout` seconds for the
    first); the loop returns on `Shutdown` or when `should_stop()` (e.g. the parent died).
    """
    last_report = 0.0
    while not should_stop():
        if not core.has_work():
            timeout = IDLE_STATS_INTERVAL_S
        elif core.last_step_scheduled:
            timeout = 0.0
        else:
            timeout = _STALLED_WAIT_S
        for msg in recv(timeout):
            if isinstance(msg, Shutdown):
                return
            _handle(core, msg)
        now = time.monotonic()
        if core.has_work():
            outputs, stats = core.step()
            # A step that ran nothing (a static batch filling up) reports only now and then.
            if outputs or core.last_step_scheduled or now - last_report >= IDLE_STATS_INTERVAL_S:
                send(CoreOutputs(outputs, stats))
                last_report = now
        elif now - last_report >= IDLE_STATS_INTERVAL_S:
            send(CoreOutputs([], core.scheduler.stats()))
            last_report = now


def _handle(core: EngineCore, msg: object) -> None:
    """One message; whatever it raises ends that request (or is logged), never the loop."""
    if isinstance(msg, EngineCoreRequest):
        try:
            core.add_request(msg)
        except Exception as e:
            if not isinstance(e, ValueError):  # a refusal is expected; anything else is a bug
                log.exception("adding request %s failed", msg.request_id)
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            core.scheduler.emit(RequestOutput(msg.request_id, [], FinishReason.ERROR, error=error))
    elif isinstance(msg, AbortRequests):
        for rid in msg.request_ids:
            try:
                core.abort_request(rid)
            except Exception:
                log.exception("aborting request %s failed", rid)
    else:
        log.warning("engine core ignores an unknown message %r", type(msg).__name__)
