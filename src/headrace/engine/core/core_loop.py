"""The engine core's busy loop: step while there is work, take messages between steps.

Transport-agnostic: the loop is handed `recv(timeout)` and `send(msg)`; a process replica runs
it over ZeroMQ (`core_proc`), the in-process variant in a thread (`core_thread`). The messages
are those of `messages`; the loop reaches the core only through `EngineCore`'s own methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore, Runner, model_runner
from headrace.engine.messages import (
    AbortRequests,
    CoreOutputs,
    EngineCoreRequest,
    FromCore,
    LoraCommand,
    Shutdown,
    ToCore,
)
from headrace.engine.sched.waiting_queue import WaitingQueue

log = logging.getLogger(__name__)

IDLE_STATS_INTERVAL_S = 0.5  # an idle core still reports its stats this often
_STALLED_WAIT_S = 0.002  # work waiting but nothing schedulable (static batch timer, deadlines)

RunnerFactory = Callable[[ModelConfig, CacheConfig], Runner]
QueueFactory = Callable[[], WaitingQueue]


@dataclass(frozen=True)
class CoreSpec:
    """Everything needed to build a core, picklable for a spawned process."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    queue_factory: QueueFactory | None = None
    runner_factory: RunnerFactory | None = None  # default: the real ModelRunner

    def build(self) -> EngineCore:
        if self.runner_factory is None:  # the real one (torch: imported only in the core)
            runner: Runner = model_runner(
                self.model_config, self.cache_config, self.scheduler_config
            )
        else:
            runner = self.runner_factory(self.model_config, self.cache_config)
        queue = self.queue_factory() if self.queue_factory is not None else None
        caching = self.cache_config.enable_prefix_caching
        return EngineCore(self.scheduler_config, runner, queue, enable_prefix_caching=caching)


def run_core_loop(
    core: EngineCore,
    recv: Callable[[float], list[ToCore]],
    send: Callable[[FromCore], None],
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
            if isinstance(msg, LoraCommand):  # between steps: no forward sees it half-done
                landed = core.drain()  # nor one still in flight (--async-scheduling)
                if landed:
                    send(CoreOutputs(landed, core.stats()))
                send(core.apply_lora(msg))
                continue
            _handle(core, msg)
        now = time.monotonic()
        if core.has_work():
            outputs, stats = core.step()
            # A step that ran nothing (a static batch filling up) reports only now and then.
            if outputs or core.last_step_scheduled or now - last_report >= IDLE_STATS_INTERVAL_S:
                send(CoreOutputs(outputs, stats))
                last_report = now
        elif now - last_report >= IDLE_STATS_INTERVAL_S:
            send(CoreOutputs([], core.stats()))
            last_report = now


def _handle(core: EngineCore, msg: ToCore) -> None:
    """One message; whatever it raises ends that request (or is logged), never the loop."""
    if isinstance(msg, EngineCoreRequest):
        try:
            core.add_request(msg)
        except Exception as e:
            if not isinstance(e, ValueError):  # a refusal is expected; anything else is a bug
                log.exception("adding request %s failed", msg.request_id)
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            core.reject(msg.request_id, error)
    elif isinstance(msg, AbortRequests):
        for rid in msg.request_ids:
            try:
                core.abort_request(rid)
            except Exception:
                log.exception("aborting request %s failed", rid)
    else:
        log.warning("engine core ignores an unknown message %r", type(msg).__name__)
