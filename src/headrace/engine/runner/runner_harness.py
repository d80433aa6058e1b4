"""Drive a `ModelRunner` without the real scheduler: a trivial block pool, fixed-size prompt
chunks, everyone in every step. For tests, benchmarks and `export`'s self-check; the engine
proper uses the scheduler and block manager instead."""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.engine.kv.table_epochs import new_table_epoch
from headrace.engine.outputs import ScheduledRequest, SchedulerOutput
from headrace.engine.runner.model_runner import ModelRunner
from headrace.request import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 30)


@dataclass
class HarnessSeq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_new: int
    chunk: int | None  # prompt tokens per step (None: all at once)
    lora_id: int = 0  # the runner's id of its LoRA adapter (0: the base model)
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)  # only ever grows: one epoch throughout
    epoch: int = field(default_factory=new_table_epoch)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new


class RunnerHarness:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.free = list(range(runner.num_kv_blocks - 1, -1, -1))
        self.seqs: dict[str, HarnessSeq] = {}
        self._released: list[str] = []  # told to the runner with the next step

    def add(
        self,
        request_id: str,
        prompt: list[int],
        max_new: int,
        params: SamplingParams = GREEDY,
        chunk: int | None = None,
        lora_id: int = 0,
    ) -> None:
        self.seqs[request_id] = HarnessSeq(
            request_id, list(prompt), params, max_new, chunk, lora_id
        )

    def schedule(self, seq: HarnessSeq) -> ScheduledRequest:
        tokens = seq.tokens
        todo = tokens[seq.num_computed :]
        n = len(todo) if seq.chunk is None else min(len(todo), seq.chunk)
        end = seq.num_computed + n
        bs = self.runner.block_size
        while len(seq.blocks) * bs < end:
            seq.blocks.append(self.free.pop())
        return ScheduledRequest(
            request_id=seq.request_id,
            token_ids=todo[:n],
            start_pos=seq.num_computed,
            block_ids=list(seq.blocks),
            sample=end == len(tokens),
            params=seq.params,
            num_output_tokens=len(seq.output),
            lora_id=seq.lora_id,
            table_epoch=seq.epoch,
        )

    def step(self, only: list[str] | None = None) -> dict[str, int]:
        """One runner step over every unfinished sequence (or those in `only`)."""
        live = [
            s for s in self.seqs.values() if not s.done and (only is None or s.request_id in only)
        ]
        scheduled = [self.schedule(s) for s in live]
        result = self.runner.execute(SchedulerOutput(scheduled, self._released))
        if scheduled:  # an empty step is not run (nor told anything)
            self._released = []
        for s, sched in zip(live, scheduled, strict=True):
            s.num_computed += len(sched.token_ids)
            if sched.request_id in result.sampled:
                s.output.append(result.sampled[sched.request_id])
        return result.sampled

    def run(self) -> dict[str, list[int]]:
        while any(not s.done for s in self.seqs.values()):
            self.step()
        return {rid: s.output for rid, s in self.seqs.items()}

    def release(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id)
        self.free.extend(reversed(seq.blocks))
        self._released.append(request_id)


def greedy(
    runner: ModelRunner,
    prompts: list[list[int]],
    max_new: int,
    chunk: int | None = None,
    lora_ids: list[int] | None = None,
) -> list[list[int]]:
    """Greedy continuations of all prompts, batched together (`lora_ids`: each prompt's
    adapter, 0 for the base)."""
    harness = RunnerHarness(runner)
    for i, p in enumerate(prompts):
        harness.add(str(i), p, max_new, chunk=chunk, lora_id=lora_ids[i] if lora_ids else 0)
    out = harness.run()
    return [out[str(i)] for i in range(len(prompts))]
