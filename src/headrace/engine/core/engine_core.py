"""The engine core: a scheduler and a model runner, stepped one model step at a time.

A step is three calls — `schedule()`, `runner.execute(out)`, `update(out, result)`. An
exception never ends the core: one inside `execute` is narrowed down to the request that causes
it (`step_retry`), which ends with `error` while the rest of the batch gets its tokens; one in
scheduling or updating fails the requests involved.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.lora_residency import lora_residency
from headrace.engine.core.overlap import overlap_for
from headrace.engine.core.step_retry import execute_isolating_failures
from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.messages import (
    CoreReady,
    EngineCoreRequest,
    LoraCommand,
    LoraDone,
    RequestOutput,
    StepStats,
)
from headrace.engine.outputs import RunnerOutput, SchedulerOutput
from headrace.engine.sched.lora_stats import lora_counts
from headrace.engine.sched.scheduler import Scheduler
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import FinishReason, Request, prefix_salt

if TYPE_CHECKING:
    from headrace.engine.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)


class Runner(Protocol):
    """What the core needs of a model runner (`headrace.engine.runner.model_runner.ModelRunner`)."""

    @property
    def num_kv_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> Sequence[int]: ...

    @property
    def model_name(self) -> str: ...

    def describe(self) -> dict[str, str | int]: ...

    def execute(self, out: SchedulerOutput) -> RunnerOutput: ...


class EngineCore:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        runner: Runner,
        queue: WaitingQueue | None = None,
        clock: Callable[[], float] = time.monotonic,
        enable_prefix_caching: bool = False,
    ) -> None:
        self.runner = runner
        self.clock = clock
        self.block_manager = BlockManager(
            runner.num_kv_blocks, runner.block_size, enable_prefix_caching
        )
        self.scheduler = Scheduler(
            scheduler_config, self.block_manager, runner.max_model_len, queue, clock
        )
        self.eos_token_ids = tuple(runner.eos_token_ids)
        self.last_stats = self.scheduler.stats()
        self.last_step_scheduled = False  # whether the last step ran the model at all
        self.lora_tokens: dict[int, int] = {}  # adapter id -> tokens computed with it
        self.lora_residency = lora_residency(scheduler_config, runner, self.scheduler)
        wanted = scheduler_config.async_scheduling
        self.overlap = overlap_for(wanted, runner, self.scheduler, self._update, self._fail_culprit)

    @classmethod
    def from_configs(
        cls,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        queue: WaitingQueue | None = None,
    ) -> EngineCore:
        """Load the model named by `model_config` and build a core around it."""
        runner = model_runner(model_config, cache_config, scheduler_config)
        caching = cache_config.enable_prefix_caching
        sched = scheduler_config.for_device(runner.device.type)
        return cls(sched, runner, queue, enable_prefix_caching=caching)

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(self, r: EngineCoreRequest) -> None:
        """Queue a request; ValueError (stating the limits) if it could never run."""
        r.validate()
        if self.overlap is not None and self.overlap.holds(r.request_id):
            for landed in self.drain():  # an ended request's id, its step still in flight:
                self.scheduler.emit(landed)  # that step lands first, not on the new one
        now = self.clock()
        # Deadlines count from the HTTP arrival when the front end stamped it (never later
        # than now, should the clocks disagree).
        start = now if r.arrival_time is None else min(r.arrival_time, now)
        lora_id = self._lora_id(r.lora_name)
        self.scheduler.add_request(
            Request(
                request_id=r.request_id,
                prompt_token_ids=list(r.prompt_token_ids),
                params=r.params,
                eos_token_ids=self._eos_for(r),
                priority=r.priority,
                tenant=r.tenant,
                weight=r.weight,
                cache_salt=prefix_salt(r.tenant, r.cache_salt, lora_id),
                lora_id=lora_id,
                arrival_time=start,
                deadline=None if r.timeout_s is None else start + r.timeout_s,
                queue_deadline=None if r.queue_timeout_s is None else start + r.queue_timeout_s,
            )
        )

    def apply_lora(self, cmd: LoraCommand) -> LoraDone:
        """Load or unload an adapter; an unloaded adapter's requests end with an error."""
        loras = getattr(self.runner, "loras", None)
        try:
            if loras is None:
                raise ValueError("this engine serves no LoRA adapters")
            if cmd.path is not None:
                running = {r.lora_id for r in self.scheduler.running}  # never evicted for it
                loras.load(cmd.name, cmd.path, running)
                return LoraDone(cmd.command_id)
            lora_id = loras.id_of(cmd.name)
            users = [r.request_id for r in self.scheduler.requests.values() if r.lora_id == lora_id]
            loras.unload(cmd.name)
            self.scheduler.fail(users, f"adapter {cmd.name!r} was unloaded")
        except Exception as e:  # refused (ValueError) or broken: the adapters stay as they were
            if not isinstance(e, ValueError):
                log.exception("LoRA command on %s failed", cmd.name)
            return LoraDone(cmd.command_id, str(e) if isinstance(e, ValueError) else repr(e))
        return LoraDone(cmd.command_id)

    def _with_core_counts(self, stats: StepStats) -> StepStats:
        """The scheduler's stats and what the core counts itself: adapters, overlapped steps."""
        if self.overlap is not None:
            total = self.overlap.overlapped_total
            stats = msgspec.structs.replace(stats, steps_overlapped_total=total)
        loras = getattr(self.runner, "loras", None)
        if loras is None:
            return stats
        names = {i: name for name, i in loras.ids.items()}
        # no adapter registered (most servers): no walk over every request each step
        requests = self.scheduler.requests.values() if names else ()
        counts = lora_counts(requests, names, self.lora_tokens)
        reg = loras.registry
        return msgspec.structs.replace(
            stats, lora_requests=counts, lora_loads_total=reg.loads_total,
            lora_evictions_total=reg.evictions_total, lora_adapters=reg.adapters(),
            max_loras=self.scheduler.config.max_loras,
        )  # fmt: skip

    def _lora_id(self, name: str | None) -> int:
        """The runner's id of adapter `name` (0: the base); ValueError if it is not loaded."""
        if name is None:
            return 0
        loras = getattr(self.runner, "loras", None)  # test runners hold no adapters
        if loras is None:
            raise ValueError(f"adapter {name!r}: this engine serves no LoRA adapters")
        lora_id: int = loras.id_of(name)
        return lora_id

    def _eos_for(self, r: EngineCoreRequest) -> tuple[int, ...]:
        if not r.eos_token_ids:
            return self.eos_token_ids
        return tuple(dict.fromkeys(self.eos_token_ids + tuple(r.eos_token_ids)))

    def reject(self, request_id: str, error: str) -> None:
        """Report a request that was never added as ended with `error` (next step's outputs)."""
        self.scheduler.emit(RequestOutput(request_id, [], FinishReason.ERROR, error=error))

    def stats(self) -> StepStats:
        """The gauges now (between steps, e.g. while idle)."""
        return self._with_core_counts(self.scheduler.stats())

    def ready_message(self, served_model_name: str | None = None) -> CoreReady:
        """What the front end learns of this core once its model is loaded."""
        runner = self.runner
        return CoreReady(
            model_name=served_model_name or runner.model_name,
            max_model_len=self.max_model_len,
            num_kv_blocks=self.block_manager.num_blocks,
            block_size=self.block_manager.block_size,
            eos_token_ids=self.eos_token_ids,
            runner=runner.describe(),
        )

    def abort_request(self, request_id: str) -> bool:
        """End a request as aborted (its output comes with the next step); False if unknown."""
        return self.scheduler.abort_request(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.in_flight

    @property
    def in_flight(self) -> bool:
        """Whether a launched step's tokens are still to be read (--async-scheduling)."""
        return self.overlap is not None and self.overlap.in_flight is not None

    def step(self) -> tuple[list[RequestOutput], StepStats]:
        start = time.perf_counter()
        ran_before = self.in_flight
        out = self._schedule()
        if self.lora_residency is not None:
            self.lora_residency.fail_unreadable()  # their requests end with this step
        keep = self.overlap is not None and self.scheduler.may_overlap(out)
        if self.overlap is not None and (ran_before or keep):
            outputs = self.overlap.step(out, keep)
        else:
            result = RunnerOutput(sampled={})
            if not out.is_empty:
                result = execute_isolating_failures(self.runner.execute, out, self._fail_culprit)
            outputs = self._update(out, result)
        for s in out.scheduled:
            if s.lora_id:
                self.lora_tokens[s.lora_id] = self.lora_tokens.get(s.lora_id, 0) + len(s.token_ids)
        stats = self.scheduler.stats(out, time.perf_counter() - start)
        self.last_stats = self._with_core_counts(stats)
        self.last_step_scheduled = not out.is_empty or ran_before
        return outputs, self.last_stats

    def drain(self) -> list[RequestOutput]:
        """Read the step in flight, if any (before a LoRA change): its outputs."""
        return self.overlap.drain() if self.overlap is not None else []

    # -- a step that breaks down fails the requests involved, never the core ---------------

    def _schedule(self) -> SchedulerOutput:
        try:
            return self.scheduler.schedule()
        except Exception as e:
            log.exception("scheduling a step failed; failing the requests it was placing")
            sched = self.scheduler
            # Running requests may hold blocks for tokens that will never be computed. With
            # none running, the cause is among the waiting: fail them rather than loop on it.
            involved = [r.request_id for r in sched.running] or list(sched.requests)
            sched.fail(involved, f"engine error while scheduling: {_describe(e)}")
            return SchedulerOutput(scheduled=[])

    def _fail_culprit(self, request_id: str, e: Exception) -> None:
        log.error("model step failed on request %s", request_id, exc_info=e)
        self.scheduler.fail([request_id], f"model step failed: {_describe(e)}")

    def _update(self, out: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        try:
            return self.scheduler.update(out, result)
        except Exception as e:
            log.exception("updating a step's requests failed; failing them")
            error = f"engine error while updating: {_describe(e)}"
            self.scheduler.fail((s.request_id for s in out.scheduled), error)
            return self.scheduler.take_outputs()


def model_runner(
    model_config: ModelConfig, cache_config: CacheConfig, scheduler_config: SchedulerConfig
) -> ModelRunner:
    """The real runner. With --max-cpu-loras its --lora adapters are loaded here, once the
    cap is set, so that no more than that many are ever in memory (each read and checked)."""
    from headrace.engine.runner.model_runner import ModelRunner  # torch: only when needed

    cap = scheduler_config.max_cpu_loras
    if cap is None:
        return ModelRunner(model_config, cache_config)
    runner = ModelRunner(dataclasses.replace(model_config, lora=()), cache_config)
    runner.loras.set_max_resident(cap)
    for name, path in model_config.lora_paths.items():
        runner.loras.load(name, path)
    return runner


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
