"""Offline, synchronous generation: an engine core stepped in this thread until done.

Used by tests, benchmarks and `headrace generate`. All prompts go in at once and share steps
by continuous batching, exactly as on the server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore, Runner
from headrace.engine.frontend.client import GenerationChunk
from headrace.engine.frontend.text_stream import RequestTextStream
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import EngineCoreRequest, TokenLogprobs
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.loader.cache import resolve_model
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import FinishReason, SamplingParams

Prompt = str | list[int]


@dataclass(frozen=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    text: str  # stop strings cut
    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[TokenLogprobs]
    error: str | None = None


class LLM:
    def __init__(
        self,
        model_config: ModelConfig | None = None,
        cache_config: CacheConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
        *,
        runner: Runner | None = None,
        tokenizer: Tokenizer | None = None,
        queue: WaitingQueue | None = None,
    ) -> None:
        """Load the model and its tokenizer, or use `runner` and `tokenizer`."""
        sched = scheduler_config or SchedulerConfig()
        cache = cache_config or CacheConfig()
        if runner is None:
            model = model_config or ModelConfig()
            model_dir, _ = resolve_model(model.model)
            with ThreadPoolExecutor(max_workers=1) as pool:  # parses while the weights load
                loading = pool.submit(load_tokenizer, model_dir)
                self.core = EngineCore.from_configs(model, cache, sched, queue)
                tokenizer = tokenizer or loading.result()
        else:
            caching = cache.enable_prefix_caching
            self.core = EngineCore(sched, runner, queue, enable_prefix_caching=caching)
        if tokenizer is None:
            raise ValueError("LLM(runner=...) needs the tokenizer that goes with it")
        self.tokenizer = tokenizer
        self._counter = 0

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        on_chunk: Callable[[GenerationChunk], None] | None = None,
        lora: str | None = None,
    ) -> list[CompletionOutput]:
        """Generate for every prompt (text or token ids); outputs in the prompts' order.

        `on_chunk` sees every streamed chunk as it is produced; `lora`: a LoRA adapter the
        runner holds (`llm.core.runner.loras.load(name, path)`), for every prompt. Raises
        ValueError (before anything runs) if a request can never fit.
        """
        batch = _as_prompt_list(prompts)
        plist = _as_params_list(params, len(batch))
        streams: dict[str, RequestTextStream] = {}
        results: dict[str, _Result] = {}
        requests = []
        for prompt, p in zip(batch, plist, strict=True):
            self._counter += 1
            rid = f"llm-{self._counter}"
            ids = self._encode(prompt)
            eos = self.tokenizer.eos_token_ids
            requests.append(EngineCoreRequest(rid, ids, p, eos_token_ids=eos, lora_name=lora))
            streams[rid] = RequestTextStream(rid, self.tokenizer, ids, p)
            results[rid] = _Result(ids)
        added = []
        try:
            for r in requests:
                self.core.add_request(r)
                added.append(r.request_id)
            self._run(streams, results, on_chunk)
        finally:
            for rid in added:  # after an error (or Ctrl-C) leave the core empty
                self.core.abort_request(rid)
        return [results[r.request_id].output(r.request_id) for r in requests]

    def _run(
        self,
        streams: dict[str, RequestTextStream],
        results: dict[str, _Result],
        on_chunk: Callable[[GenerationChunk], None] | None,
    ) -> None:
        open_ids = set(streams)
        while open_ids:
            outputs, _ = self.core.step()
            for out in outputs:
                stream = streams.get(out.request_id)
                chunk = stream.process(out) if stream is not None else None
                if chunk is None:
                    continue
                results[out.request_id].add(chunk)
                if on_chunk is not None:
                    on_chunk(chunk)
                if chunk.finished:
                    open_ids.discard(out.request_id)
                    if not out.finished:  # a stop string: the core does not know yet
                        self.core.abort_request(out.request_id)

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        return list(prompt)


class _Result:
    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = prompt_ids
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.finish_reason = FinishReason.ABORT
        self.error: str | None = None

    def add(self, chunk: GenerationChunk) -> None:
        self.text.append(chunk.text)
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.error = chunk.error

    def output(self, request_id: str) -> CompletionOutput:
        return CompletionOutput(
            request_id,
            self.prompt_ids,
            "".join(self.text),
            self.token_ids,
            self.finish_reason,
            self.logprobs,
            self.error,
        )


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [list(items)]  # type: ignore[arg-type]  # one tokenized prompt
    return items  # type: ignore[return-value]


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"{len(params)} sampling params for {n} prompts")
    return list(params)
