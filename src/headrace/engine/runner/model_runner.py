"""Loads a model, owns its paged KV pool, and computes one scheduled step at a time."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.kv.kv_budget import kv_budget_gib
from headrace.engine.kv.kv_cache import KVCache, blocks_for_budget
from headrace.engine.outputs import RunnerOutput, SchedulerOutput
from headrace.engine.runner.block_rows import BlockRows
from headrace.engine.runner.decode_graphs import DecodeGraphs, decode_graphs
from headrace.engine.runner.determinism import choose_matmuls
from headrace.engine.runner.fault_injection import inject_fault, poison_token_from_env
from headrace.engine.runner.head_picks import (
    int8_greedy_head,
    pick_tokens,
    runner_output,
    screened_sampler,
)
from headrace.engine.runner.launched import LastTokens, Launched
from headrace.engine.runner.logprobs import logprob_table
from headrace.engine.runner.precision import pick_device, pick_dtype
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.step_checks import check_step
from headrace.engine.runner.step_inputs import StepInputs, build_step_inputs
from headrace.engine.runner.structured import GrammarMasks
from headrace.kernels.int8_head import Int8GreedyHead
from headrace.kernels.paged_decode import supported as paged_decode_supported
from headrace.kernels.paged_prefill import supported as paged_prefill_supported
from headrace.layers import compiled
from headrace.loader.cache import resolve_model
from headrace.loader.files import read_json
from headrace.loader.hf import load_model
from headrace.lora.manager import LoraManager
from headrace.models.base import CausalLM

log = logging.getLogger(__name__)


def generation_eos_ids(model_dir: Path) -> tuple[int, ...]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    eos = read_json(path, "generation config").get("eos_token_id")
    return () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))


class ModelRunner:
    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig) -> None:
        if model_config.num_threads:
            torch.set_num_threads(model_config.num_threads)
        device = pick_device(model_config.device)
        compiled.enable(model_config.torch_compile and device.type == "cuda")
        dtype = pick_dtype(model_config.dtype, device)
        model_dir, name = resolve_model(model_config.model)
        cap = model_config.max_model_len or 1 << 40
        model, _ = load_model(model_dir, dtype, device, cap)
        choose_matmuls(model, model_config, model_dir)
        self._setup(
            model,
            model_dir,
            cache_config,
            max_model_len=min(cap, model.args.max_position_embeddings),
            model_name=model_config.served_model_name or name,
            extra_eos=generation_eos_ids(model_dir),
            deterministic=model_config.deterministic,
            graphs=False if model_config.enforce_eager else None,
        )
        self.loras.max_rank = model_config.max_lora_rank
        for lora_name, lora_path in model_config.lora_paths.items():
            self.loras.load(lora_name, lora_path)

    @classmethod
    def from_parts(
        cls,
        model: CausalLM,
        model_dir: Path | None,
        cache_config: CacheConfig | None = None,
        max_model_len: int | None = None,
        model_name: str = "model",
        deterministic: bool = False,
        graphs: bool | None = None,
    ) -> ModelRunner:
        """A runner around an already loaded model (tests build several from one load);
        `model_dir` holds its tokenizer.json, which structured outputs read; `deterministic`:
        the model's matmuls already made row-invariant (`choose_matmuls`); `graphs`: decode
        steps through `DecodeGraphs` (None: on CUDA; True: also here, run eagerly)."""
        runner = cls.__new__(cls)
        cap = min(max_model_len or 1 << 40, model.args.max_position_embeddings)
        cache = cache_config or CacheConfig()
        runner._setup(model, model_dir, cache, cap, model_name, (), deterministic, graphs)
        return runner

    def _setup(
        self,
        model: CausalLM,
        model_dir: Path | None,
        cache_config: CacheConfig,
        max_model_len: int,
        model_name: str,
        extra_eos: tuple[int, ...],
        deterministic: bool = False,
        graphs: bool | None = None,
    ) -> None:
        self.model = model
        self.model_dir = model_dir  # its tokenizer.json: structured outputs read it
        self.model_name = model_name
        weight = model.embed_weight
        self.device, self.dtype = weight.device, weight.dtype
        if self.device.type == "cuda":  # Triton launches and graphs go to the current device
            torch.cuda.set_device(self.device)
        self.vocab_size = model.args.vocab_size
        # Built while the KV pool is allocated (1.3-2 s for Gemma's head on 2 cores), and
        # waited for below: a runner is final when it is ready, its picks never switch paths.
        self._head_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="int8-head")
        self._greedy_head = self._head_pool.submit(int8_greedy_head, model)
        self._head_pool.shutdown(wait=False)
        self._size_pool(cache_config, max_model_len)
        # The model's own; the front end adds its tokenizer's (chat turn ends) per request.
        eos = model.args.eos_token_ids + extra_eos
        self.eos_token_ids = tuple(dict.fromkeys(i for i in eos if 0 <= i < self.vocab_size))
        self.grammars = GrammarMasks(
            partial(_tokenizer_json, model_dir), self.vocab_size, self.eos_token_ids
        )
        if model_dir is not None:  # builds while the KV pool is allocated, the int8 head starts
            self.grammars.start()
        graphs = self.device.type == "cuda" if graphs is None else graphs
        self.kv_cache = KVCache(
            model.args, self.num_kv_blocks, self.block_size, self.dtype, self.device, graphs
        )
        self.sampler = Sampler()
        self.sampler.in_flight = self.last_tokens.tokens_of  # a penalty's placeholder
        self.loras = LoraManager(model)  # adapters, loaded by name (--lora, admin routes)
        self._finish_setup(model_dir, deterministic)

    def _size_pool(self, cache_config: CacheConfig, max_model_len: int) -> None:
        """The KV pool's blocks (given, or what the memory budget holds) and the context it
        serves: at most what the pool holds."""
        self.block_size = cache_config.block_size
        self.num_kv_blocks = cache_config.num_kv_blocks or blocks_for_budget(
            self.model.args, self.block_size, self.dtype, kv_budget_gib(cache_config, self.device)
        )
        self.max_model_len = _context_in_pool(max_model_len, self.num_kv_blocks * self.block_size)
        self.block_rows = BlockRows(self.num_kv_blocks)  # the decodes' tables, between steps
        self.last_tokens = LastTokens()  # the last step's picks, where --async-scheduling reads

    def _finish_setup(self, model_dir: Path | None, deterministic: bool) -> None:
        """Attention path and fault injection; then the wait for the background builds."""
        self.poison_token = poison_token_from_env()
        args = self.model.args
        shape = (args.num_heads, args.num_kv_heads, args.head_dim, self.block_size)
        self.paged_kernel = paged_decode_supported(self.device, self.dtype, shape)
        self.paged_prefill = paged_prefill_supported(self.device, self.dtype, shape)  # CUDA
        self.per_token_attention = deterministic and self.paged_kernel
        if deterministic and not self.paged_kernel:
            log.warning("--deterministic: no paged decode kernel here; attention is not per token")
        # needs the in-place decode attention: the gathered path's shapes change every step
        self.decode_graphs: DecodeGraphs | None = None
        if self.paged_kernel:
            self.decode_graphs = decode_graphs(
                self.model, self.kv_cache, self.max_model_len, self.per_token_attention
            )
        if model_dir is not None:
            # Before ready: the build holds the GIL for seconds (docs/performance.md), which
            # in a background thread would stall every stream's steps instead.
            waited = self.grammars.wait_started()
            built = self.grammars.table_build_s or 0.0
            log.info("grammar token table built in %.2f s (start waited %.2f s)", built, waited)
        self.screened_sampler = screened_sampler(self.model, self.wait_greedy_head())
        log.info(
            "runner ready: %s on %s in %s, %d KV blocks of %d tokens (%.2f GiB), max_model_len %d",
            self.model_name,
            self.device,
            str(self.dtype).removeprefix("torch."),
            self.num_kv_blocks,
            self.block_size,
            self.kv_cache.nbytes / (1 << 30),
            self.max_model_len,
        )

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.finish(self.launch(out))

    def finish(self, launched: Launched) -> RunnerOutput:
        """A launched step's tokens (waits for the device where it still runs)."""
        return launched.read()

    def launch(self, out: SchedulerOutput, keep: bool = False) -> Launched:
        """Run step `out` up to its picks. `keep`: its sampled ids stay on the device for the
        next step's placeholders, which may be launched before these are read (the step's
        rows are plain then: core/overlap.py)."""
        if out.is_empty:
            return Launched(RunnerOutput(sampled={}))
        inputs = self._step_inputs(out)
        with torch.inference_mode():
            graphs = self.decode_graphs
            if graphs is not None and graphs.takes(inputs):
                hidden = graphs.run(inputs)
            else:
                hidden = self.model(
                    inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta
                )  # [T, H]
            if not inputs.sampled:
                self.last_tokens.clear()
                return Launched(RunnerOutput(sampled={}))
            # The sampled rows, then the drafts' rows: one pass over the head for all of them.
            drafts = inputs.draft_rows
            rows = hidden[
                inputs.sample_rows if drafts is None else torch.cat([inputs.sample_rows, drafts])
            ]
            if keep and self.greedy_head is None:  # the picks stay on the device
                ids = [r.request_id for r in inputs.sampled]
                logits = self.model.compute_logits(rows)
                tokens = self.sampler.pick(logits, inputs.sampled)
                table = logprob_table(logits, inputs.sampled, tokens)
                launched = Launched.on_device(ids, tokens, table)
                self.last_tokens.keep(ids, tokens)  # last: a launch that fails keeps none
                return launched
            picked = pick_tokens(
                rows, inputs.sampled, self.greedy_head, self.model.compute_logits, self.sampler,
                self.grammars, self.screened_sampler,
            )  # fmt: skip
            self.grammars.advance(inputs.sampled, picked.tokens, picked.ends)
        self.last_tokens.clear()
        if keep:  # the int8 head's picks (the CPU): lists, kept as a tensor for the next step
            ids = [r.request_id for r in inputs.sampled]
            self.last_tokens.keep(ids, torch.tensor(picked.tokens, dtype=torch.int64))
        return Launched(runner_output(inputs.sampled, picked))

    def _step_inputs(self, out: SchedulerOutput) -> StepInputs:
        """Checks, the step's tensors, grammars and LoRA rows."""
        self.block_rows.drop(out.finished_ids)  # first: a step refused below still ends them
        self.grammars.drop(out.finished_ids)
        paged = self.paged_kernel
        limits = (self.max_model_len, self.vocab_size, self.num_kv_blocks, self.block_size)
        check_step(out, *limits, decode_blocks_checked=paged, pending_ok=self.last_tokens.held)
        inputs = build_step_inputs(  # checks the decodes' new blocks (block_rows)
            out.scheduled,
            self.block_size,
            self.model.args.windows,
            self.device,
            self.dtype,
            paged_kernel=paged,
            paged_prefill=self.paged_prefill,
            per_token=self.per_token_attention,
            block_rows=self.block_rows,
        )
        self.last_tokens.fill(inputs.input_ids, inputs.pending)  # --async-scheduling
        if self.poison_token is not None:
            inject_fault(out, self.poison_token)
        self.grammars.prepare(out.scheduled)  # matchers build while the model computes
        self.loras.set_rows(inputs.lora_segments)
        return inputs

    @property
    def greedy_head(self) -> Int8GreedyHead | None:
        """The int8 greedy head once built (None before, or where it does not apply)."""
        return self._greedy_head.result() if self._greedy_head.done() else None

    def wait_greedy_head(self) -> Int8GreedyHead | None:
        return self._greedy_head.result()

    def describe(self) -> dict[str, str | int]:
        return {
            "model": self.model_name,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
        }


def _context_in_pool(max_model_len: int, pool_tokens: int) -> int:
    """The context a request may have: no more than the KV pool holds, or a request the model
    allows (a chat's default max_tokens fills the context) would be refused at every step."""
    if pool_tokens >= max_model_len:
        return max_model_len
    log.warning(
        "the KV pool holds %d tokens, fewer than max_model_len %d: serving a context of %d "
        "(raise --kv-cache-memory-gb / --num-kv-blocks, or set --max-model-len)",
        pool_tokens, max_model_len, pool_tokens,
    )  # fmt: skip
    return pool_tokens


def _tokenizer_json(model_dir: Path | None) -> str:
    """The only part of a tokenizer the core reads: llguidance builds its token table from it
    (while the runner starts)."""
    if model_dir is None:
        raise ValueError("structured outputs need the model's tokenizer.json; this runner has none")
    return (model_dir / "tokenizer.json").read_text(encoding="utf-8")
