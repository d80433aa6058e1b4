"""--async-scheduling: the next step is scheduled and launched before this one's tokens are read.

In series a step is `schedule → execute → update`, and on a GPU the device idles while the
host schedules, builds the inputs, reads the tokens and checks stops. With overlap a step is

    schedule N+1 → launch N+1 → N lands (its tokens read, `update`) → assume N+1

so the host's work for N and N+1 runs while the device computes N+1. Scheduling N+1 before N's
tokens are known needs two things: the scheduler *assumes* each of N's requests got its token
(a placeholder, `PENDING_TOKEN`, in its output; its computed tokens moved on), and the runner
fills each placeholder in N+1's inputs on the device from N's sampled ids.

Only a step whose tokens the host need not read before the next is scheduled overlaps
(`Scheduler.may_overlap`): no drafts (their acceptance decides the next tokens), no sampled
row with a grammar (its matcher reads each token; penalties and bad words take the history's
last token on the device, logit_bias, min_tokens and logprobs need none), and no speculation
due next (few running requests: drafts are found in the tokens before them). Any other step
runs in series, as does the step after it. What changes for a request: a stop token found at
N leaves one wasted row in N+1 (its output dropped); an abort or deadline ends it a step
later at most. The tokens do not change: a seeded draw depends on the output index, which
moves on the same way (tests/engine/core/test_overlap.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import msgspec

from headrace.engine.core.step_retry import OnCulprit, execute_isolating_failures
from headrace.engine.messages import RequestOutput
from headrace.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput
from headrace.engine.sched.scheduler import Scheduler
from headrace.request import PENDING_TOKEN

log = logging.getLogger(__name__)


class Launching(Protocol):
    """A runner that can launch a step and read its tokens later (`ModelRunner`)."""

    def launch(self, out: SchedulerOutput, keep: bool = False) -> object: ...
    def finish(self, launched: object) -> RunnerOutput: ...
    def execute(self, out: SchedulerOutput) -> RunnerOutput: ...


@dataclass(frozen=True)
class InFlight:
    out: SchedulerOutput
    launched: object  # the runner's handle on the step


def with_tokens(out: SchedulerOutput, sampled: dict[str, int]) -> SchedulerOutput:
    """`out` with each placeholder replaced by the token the step before sampled (0 for a
    request that got none: it has ended, and its row's output is dropped): in its input, and
    at the end of the history its logits processors read (penalties, bad words)."""

    def filled(s: ScheduledRequest) -> ScheduledRequest:
        token = sampled.get(s.request_id, 0)
        inputs = s.logits_inputs
        if inputs is not None and inputs.output_token_ids[-1:] == [PENDING_TOKEN]:
            history = [*inputs.output_token_ids[:-1], token]
            inputs = msgspec.structs.replace(inputs, output_token_ids=history)
            s = msgspec.structs.replace(s, logits_inputs=inputs)
        if s.token_ids[-1] != PENDING_TOKEN:
            return s
        return msgspec.structs.replace(s, token_ids=[*s.token_ids[:-1], token])

    return msgspec.structs.replace(out, scheduled=[filled(s) for s in out.scheduled])


class Overlap:
    """The core's steps with one in flight (`step`), and the last one landed (`drain`)."""

    def __init__(
        self,
        runner: Launching,
        scheduler: Scheduler,
        update: Callable[[SchedulerOutput, RunnerOutput], list[RequestOutput]],
        on_culprit: OnCulprit,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.update = update
        self.on_culprit = on_culprit
        self.in_flight: InFlight | None = None
        self.overlapped_total = 0  # steps left in flight (StepStats.steps_overlapped_total)

    def step(self, out: SchedulerOutput, keep: bool) -> list[RequestOutput]:
        """Launch `out`, land the step in flight, then leave `out` in flight (`keep`: the
        scheduler's `may_overlap`) or land it too."""
        launched, failed = None, False
        if not out.is_empty:
            try:
                launched = self.runner.launch(out, keep)
            except Exception:  # run again below, alone, once the step before it has landed
                log.warning("launching a step failed; running it again in series", exc_info=True)
                failed = True
        outputs: list[RequestOutput] = []
        before = RunnerOutput(sampled={})
        if self.in_flight is not None:
            before, outputs = self.drain_with_result()
        if launched is not None and keep:
            self.scheduler.assume(out)
            self.in_flight = InFlight(out, launched)
            self.overlapped_total += 1
            return outputs
        if launched is not None:
            result = self._finish(out, launched)
        elif failed:
            result = execute_isolating_failures(
                self.runner.execute, with_tokens(out, before.sampled), self.on_culprit
            )
        else:
            return outputs
        return outputs + self.update(out, result)

    def holds(self, request_id: str) -> bool:
        """Whether the step in flight has a row of that id (asked only when a request comes)."""
        flight = self.in_flight
        return flight is not None and any(s.request_id == request_id for s in flight.out.scheduled)

    def drain(self) -> list[RequestOutput]:
        """Land the step in flight, if any: its outputs."""
        return self.drain_with_result()[1] if self.in_flight is not None else []

    def drain_with_result(self) -> tuple[RunnerOutput, list[RequestOutput]]:
        flight, self.in_flight = self.in_flight, None
        assert flight is not None
        result = self._finish(flight.out, flight.launched)
        return result, self.update(flight.out, result)

    def _finish(self, out: SchedulerOutput, launched: object) -> RunnerOutput:
        """The step's tokens; if reading them fails (a device error surfaces there), its
        requests end with the error."""
        try:
            return self.runner.finish(launched)
        except Exception as e:
            log.exception("reading a step's tokens failed; failing its requests")
            error = f"model step failed: {type(e).__name__}: {e}"
            self.scheduler.fail((s.request_id for s in out.scheduled), error)
            return RunnerOutput(sampled={})


def overlap_for(
    wanted: bool,
    runner: object,
    scheduler: Scheduler,
    update: Callable[[SchedulerOutput, RunnerOutput], list[RequestOutput]],
    on_culprit: OnCulprit,
) -> Overlap | None:
    """--async-scheduling where it is `wanted` and the runner can launch a step and read it
    later (test runners may not)."""
    if not wanted:
        return None
    if not hasattr(runner, "launch"):
        log.warning("--async-scheduling: this runner cannot launch a step; steps run in series")
        return None
    return Overlap(cast(Launching, runner), scheduler, update, on_culprit)
