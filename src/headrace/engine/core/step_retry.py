"""A failed model step is retried without the request that made it fail.

When `execute` raises, the step's requests are split in halves, each run as its own
`SchedulerOutput`, recursively; a single request that still fails is a culprit and ends with
`error`, and every other request gets its token in the same step. A poisoned request in a
batch of n costs about 2·log2(n) extra runs, and only in the step that meets it.

Retrying is safe because a run writes each request's KV entries into that request's own
slots, from its own tokens: a half that is run again rewrites the same values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from headrace.engine.messages import TokenLogprobs
from headrace.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput

log = logging.getLogger(__name__)

Execute = Callable[[SchedulerOutput], RunnerOutput]
OnCulprit = Callable[[str, Exception], None]  # (request id, what it raised)


def execute_isolating_failures(
    execute: Execute, out: SchedulerOutput, on_culprit: OnCulprit
) -> RunnerOutput:
    """`execute(out)`, or, if it raises, the merged results of the sub-steps that succeed.

    `on_culprit` is called for each request that fails alone; it is left out of the result.
    """
    try:
        return execute(out)
    except Exception as e:
        if len(out.scheduled) == 1:
            on_culprit(out.scheduled[0].request_id, e)
            return RunnerOutput(sampled={})
        log.warning(
            "model step of %d requests failed (%s: %s); retrying it in halves to find the cause",
            len(out.scheduled), type(e).__name__, e,
        )  # fmt: skip
    retry = _Bisect(execute, on_culprit, out.finished_ids)
    retry.split(out.scheduled)
    return RunnerOutput(
        retry.sampled, retry.logprobs, retry.picks, stopped=retry.stopped, errors=retry.errors
    )


class _Bisect:
    def __init__(self, execute: Execute, on_culprit: OnCulprit, finished_ids: list[str]) -> None:
        self.execute = execute
        self.on_culprit = on_culprit
        # The runner may drop these requests' state: sent with the first sub-step, and with
        # the next ones until one succeeds (dropping state twice is harmless).
        self.finished_ids = finished_ids
        self.sampled: dict[str, int] = {}
        self.logprobs: dict[str, TokenLogprobs] = {}
        self.picks: dict[str, list[int]] = {}
        self.stopped: list[str] = []
        self.errors: dict[str, str] = {}

    def split(self, scheduled: list[ScheduledRequest]) -> None:
        mid = len(scheduled) // 2
        self.run(scheduled[:mid])
        self.run(scheduled[mid:])

    def run(self, scheduled: list[ScheduledRequest]) -> None:
        if not scheduled:
            return
        try:
            result = self.execute(SchedulerOutput(scheduled, self.finished_ids))
        except Exception as e:
            if len(scheduled) > 1:
                self.split(scheduled)
            else:
                self.on_culprit(scheduled[0].request_id, e)
            return
        self.finished_ids = []
        self.sampled.update(result.sampled)
        self.logprobs.update(result.logprobs)
        self.picks.update(result.draft_picks)
        self.stopped += result.stopped
        self.errors.update(result.errors)
