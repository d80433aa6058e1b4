"""The engine core: a scheduler and a model runner, stepped one model step at a time.

A step is three calls — `schedule()`, `runner.execute(out)`, `update(out, result)`. An
exception inside `execute` fails that step's requests with `error` and the core keeps serving
the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.block_manager import BlockManager
from headrace.engine.outputs import RequestOutput, RunnerOutput, SchedulerOutput, StepStats
from headrace.engine.scheduler import Scheduler
from headrace.engine.waiting_queue import WaitingQueue
from headrace.request import Request, SamplingParams

log = logging.getLogger(__name__)


class Runner(Protocol):
    """What the core needs of a model runner (`headrace.engine.model_runner.ModelRunner`)."""

    @property
    def num_kv_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> Sequence[int]: ...

    def execute(self, out: SchedulerOutput) -> RunnerOutput: ...


@dataclass(frozen=True)
class EngineCoreRequest:
    """A tokenized request as the front end hands it to a core (picklable)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 1
    tenant: str = "default"
    weight: float = 1.0
    timeout_s: float | None = None  # whole request, from arrival at the core
    queue_timeout_s: float | None = None  # not started by then -> `overloaded`


class EngineCore:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        runner: Runner,
        queue: WaitingQueue | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.clock = clock
        self.block_manager = BlockManager(runner.num_kv_blocks, runner.block_size)
        self.scheduler = Scheduler(
            scheduler_config, self.block_manager, runner.max_model_len, queue, clock
        )
        self.eos_token_ids = tuple(runner.eos_token_ids)
        self.last_stats = self.scheduler.stats()
        self.last_step_scheduled = False  # whether the last step ran the model at all

    @classmethod
    def from_configs(
        cls,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        queue: WaitingQueue | None = None,
    ) -> EngineCore:
        """Load the model named by `model_config` and build a core around it."""
        from headrace.engine.model_runner import ModelRunner  # torch: import only when needed

        return cls(scheduler_config, ModelRunner(model_config, cache_config), queue)

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(self, r: EngineCoreRequest) -> None:
        """Queue a request; ValueError (stating the limits) if it could never run."""
        now = self.clock()
        self.scheduler.add_request(
            Request(
                request_id=r.request_id,
                prompt_token_ids=list(r.prompt_token_ids),
                params=r.params,
                eos_token_ids=self.eos_token_ids,
                priority=r.priority,
                tenant=r.tenant,
                weight=r.weight,
                arrival_time=now,
                deadline=None if r.timeout_s is None else now + r.timeout_s,
                queue_deadline=None if r.queue_timeout_s is None else now + r.queue_timeout_s,
            )
        )

    def abort_request(self, request_id: str) -> bool:
        """End a request as aborted (its output comes with the next step); False if unknown."""
        return self.scheduler.abort_request(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> tuple[list[RequestOutput], StepStats]:
        start = time.perf_counter()
        out = self.scheduler.schedule()
        result = RunnerOutput(sampled={})
        if not out.is_empty:
            try:
                result = self.runner.execute(out)
            except Exception as e:  # a failed step must not take the other requests down
                log.exception("model step failed; failing its %d requests", len(out.scheduled))
                self.scheduler.fail(out, f"model step failed: {type(e).__name__}: {e}")
        outputs = self.scheduler.update(out, result)
        self.last_stats = self.scheduler.stats(out, time.perf_counter() - start)
        self.last_step_scheduled = not out.is_empty
        return outputs, self.last_stats
