"""Engine factories: a deterministic fake runner over a simulated paged KV cache, schedulers,
requests and prompts for it, and `FakeCore`, an engine core on that runner.

The fake runner writes every scheduled token into its own block pool through the block table
it is handed, and computes the next token from what it reads back — so a wrong block table,
position or recompute after preemption changes the output. Unit tests only; the real-model
tests use tiny random-weight Hugging Face models (`factories.models`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence

import msgspec

from headrace.config import SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.messages import EngineCoreRequest, RequestOutput, StepStats
from headrace.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput
from headrace.engine.sched.scheduler import Scheduler
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import PENDING_TOKEN, Request, SamplingParams

FAKE_VOCAB = 101
FAKE_EOS = 0


def fake_next_token(history: Sequence[int], params: SamplingParams, num_output: int) -> int:
    """The fake model: a hash of all previous tokens (and of seed and step when sampling)."""
    data = ",".join(map(str, history))
    if not params.greedy:
        data += f"|{params.seed}|{num_output}"
    return zlib.crc32(data.encode()) % FAKE_VOCAB


def fake_reference(
    prompt: list[int], params: SamplingParams, max_model_len: int = 10**9
) -> list[int]:
    """What the fake model generates for one request run alone."""
    out: list[int] = []
    while True:
        tok = fake_next_token(prompt + out, params, len(out))
        out.append(tok)
        stop = (tok == FAKE_EOS and not params.ignore_eos) or tok in params.stop_token_ids
        if stop or len(out) >= params.max_tokens or len(prompt) + len(out) >= max_model_len:
            return out


class FakeRunner:
    def __init__(
        self,
        num_kv_blocks: int = 64,
        block_size: int = 4,
        max_model_len: int = 256,
        fail_when: Callable[[SchedulerOutput], bool] | None = None,
        step_delay_s: float = 0.0,
        tokenizer: object | None = None,
        poison_full_blocks: bool = False,
    ) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = (FAKE_EOS,)
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_kv_blocks)]
        self.steps: list[SchedulerOutput] = []
        self.owner: dict[int, str] = {}  # block -> the request that last wrote it
        self.fail_when = fail_when
        self.step_delay_s = step_delay_s
        self.tokenizer = tokenizer
        self.model_name = "fake"
        # A full block may outlive its request in the prefix cache: poisoned only when the
        # engine caches nothing.
        self.poison_full_blocks = poison_full_blocks

    def describe(self) -> dict[str, str | int]:
        return {"model": self.model_name, "device": "fake"}

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.steps.append(out)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.fail_when is not None and self.fail_when(out):
            raise RuntimeError("injected failure")
        # A finished request's blocks are poisoned so that a stale read fails loudly.
        for rid in out.finished_ids:
            for block, owner in list(self.owner.items()):
                full = None not in self.kv[block]
                if owner == rid and (self.poison_full_blocks or not full):
                    self.kv[block] = [None] * self.block_size
                    del self.owner[block]
        sampled = {}
        picks: dict[str, list[int]] = {}
        bs = self.block_size
        for s in out.scheduled:
            assert len(s.block_ids) * bs >= s.start_pos + len(s.token_ids)
            for i, tok in enumerate(s.token_ids):
                pos = s.start_pos + i
                self.kv[s.block_ids[pos // bs]][pos % bs] = tok
                self.owner[s.block_ids[pos // bs]] = s.request_id
            if s.sample:
                # The token after the last known one, and after each draft (speculation).
                known = s.start_pos + len(s.token_ids) - len(s.draft_token_ids)
                sampled[s.request_id] = self._next(s, known)
                if s.draft_token_ids:
                    picks[s.request_id] = [
                        self._next(s, known + 1 + i) for i in range(len(s.draft_token_ids))
                    ]
        return RunnerOutput(sampled=sampled, draft_picks=picks)

    def _next(self, s: ScheduledRequest, end: int) -> int:
        """The fake model's token after the first `end` tokens of `s`, read from the pool."""
        bs = self.block_size
        history = [self.kv[s.block_ids[p // bs]][p % bs] for p in range(end)]
        assert None not in history
        return fake_next_token([t for t in history if t is not None], s.params, s.num_output_tokens)


class FakeLaunchingRunner(FakeRunner):
    """The fake runner with the real one's launch / finish (--async-scheduling): a placeholder
    takes the token its request sampled in the step launched just before, as the real runner
    fills it on the device; `execute` (a step retried in series) takes none."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.last: dict[str, int] = {}  # the last launched step's tokens, where it kept them
        self.filled = 0  # placeholders filled, in all
        self.launches: list[SchedulerOutput] = []  # as scheduled, placeholders and all

    def launch(self, out: SchedulerOutput, keep: bool = False) -> RunnerOutput:
        self.launches.append(out)
        scheduled = [self._fill(s) for s in out.scheduled]
        result = self.execute(msgspec.structs.replace(out, scheduled=scheduled))
        self.last = dict(result.sampled) if keep else {}
        return result

    def finish(self, launched: RunnerOutput) -> RunnerOutput:
        return launched

    def _fill(self, s: ScheduledRequest) -> ScheduledRequest:
        if PENDING_TOKEN not in s.token_ids:
            return s
        assert s.token_ids == [PENDING_TOKEN], s  # a decode's one token, nothing else
        self.filled += 1
        return msgspec.structs.replace(s, token_ids=[self.last[s.request_id]])


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 256,
    enable_prefix_caching: bool = False,
    **cfg: object,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(**cfg),  # type: ignore[arg-type]
        BlockManager(num_blocks, block_size, enable_prefix_caching),
        max_model_len,
    )


def make_request(
    rid: str,
    prompt_len: int = 8,
    max_tokens: int = 8,
    priority: int = 1,
    arrival: float = 0.0,
    **params: object,
) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=make_prompt(zlib.crc32(rid.encode()), prompt_len),
        params=SamplingParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
        eos_token_ids=(FAKE_EOS,),
        priority=priority,
        arrival_time=arrival,
    )


_OPTION_FIELDS = (
    "priority", "tenant", "weight", "timeout_s", "queue_timeout_s", "arrival_time", "cache_salt",
)  # fmt: skip


def make_prompt(seed: int, length: int) -> list[int]:
    return [1 + zlib.crc32(f"{seed}:{i}".encode()) % (FAKE_VOCAB - 1) for i in range(length)]


class FakeCore:
    """An EngineCore on a FakeRunner that checks the block invariants after every step."""

    def __init__(
        self,
        runner: FakeRunner | None = None,
        clock: Callable[[], float] | None = None,
        queue: WaitingQueue | None = None,
        enable_prefix_caching: bool = False,
        **cfg: object,
    ) -> None:
        self.runner = runner or FakeRunner(poison_full_blocks=not enable_prefix_caching)
        self.now = 0.0
        self.core = EngineCore(
            SchedulerConfig(**cfg),  # type: ignore[arg-type]
            self.runner,
            queue,
            clock or (lambda: self.now),
            enable_prefix_caching=enable_prefix_caching,
        )
        self.tokens: dict[str, list[int]] = {}
        self.finished: dict[str, RequestOutput] = {}
        self.stats: list[StepStats] = []

    def add(self, rid: str, prompt: list[int], **kw: object) -> None:
        opts = {k: kw.pop(k) for k in list(kw) if k in _OPTION_FIELDS}
        self.core.add_request(
            EngineCoreRequest(rid, prompt, SamplingParams(**kw), **opts)  # type: ignore[arg-type]
        )

    def step(self) -> list[RequestOutput]:
        self.now += 0.001
        outputs, stats = self.core.step()
        self.stats.append(stats)
        for o in outputs:
            self.tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                self.finished[o.request_id] = o
        sched = self.core.scheduler
        self.core.block_manager.check_invariants(
            {r.request_id: r.num_computed_tokens for r in sched.running}
        )
        assert stats.kv_blocks_used == self.core.block_manager.num_used_blocks
        return outputs

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.core.has_work():
                return
            self.step()
        raise AssertionError("engine did not drain")
