"""A testing aid: a step that computes a given token id raises (tests/api/test_poison.py).

It reads the step's token ids on the host: with --async-scheduling a decode whose token the
step before sampled carries a placeholder there, so only prompt tokens (and steps run in
series) can trip it."""

from __future__ import annotations

import logging
import os

from headrace.engine.outputs import SchedulerOutput

log = logging.getLogger("headrace.engine.runner.model_runner")  # where the warning always was
# Fault injection for tests: a step that computes this token id raises (unset: no effect).
POISON_TOKEN_ENV = "HEADRACE_FAULT_POISON_TOKEN"


def poison_token_from_env() -> int | None:
    raw = os.environ.get(POISON_TOKEN_ENV, "").strip()
    if not raw:
        return None
    log.warning(
        "%s=%s: steps computing token %s will fail (a testing aid)", POISON_TOKEN_ENV, raw, raw
    )
    return int(raw)


def inject_fault(out: SchedulerOutput, token: int) -> None:
    for req in out.scheduled:
        if token in req.token_ids:
            raise RuntimeError(f"{POISON_TOKEN_ENV}: request {req.request_id} has token {token}")
