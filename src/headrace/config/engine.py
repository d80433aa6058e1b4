"""The model, its KV cache and the scheduler: what one engine runs with."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from headrace.config.fields import setting


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = setting(None, "GGUF file or Hugging Face directory (default: Gemma 3 270M)")
    served_model_name: str | None = setting(None, "name clients use in `model` (default: derived)")
    dtype: str = setting(
        "auto",
        "float32 | bfloat16 | float16 | auto (bf16 on CUDA and CPUs with native bf16, else fp32)",
    )
    device: str = setting("auto", "cpu | cuda | auto")
    int8_matmuls: str = setting(
        "auto",
        "int8 layer matmuls (dynamic per-row activations) in steps of 5+ tokens: on | off | "
        "auto (on for bf16 on CPUs with int8 dot products, VNNI or AMX, except in steps with "
        "LoRA adapter rows; docs/performance.md)",
    )
    gguf_blocks: str = setting(
        "auto",
        "decode steps of 1-4 rows compute with a GGUF's own quantized blocks (Q4/Q5/Q6 types; "
        "the file's weights exactly, at about half the bytes of bf16): auto (bf16 on CPUs with "
        "AVX-512 BF16) | off (docs/performance.md)",
    )
    deterministic: bool = setting(
        False,
        "batch-invariant greedy: a plain greedy request's tokens do not depend on its step's "
        "other requests, chunk sizes, prefix-cache hits or speculation (int8 matmuls off, one "
        "row-independent matmul, per-token attention; CPU bf16; docs/engine.md)",
    )
    enforce_eager: bool = setting(
        False,
        "no CUDA graphs: every decode step runs the model's forward eagerly (on CUDA, decode "
        "steps of up to 256 rows otherwise replay a graph per batch bucket; docs/performance.md)",
    )
    torch_compile: bool = setting(
        False,
        "CUDA: each layer's small ops (a norm with its residual add, rotary, act(gate) * up) "
        "fused by torch.compile, compiled at start and cached on disk; logits within bf16 "
        "rounding of the eager ones (docs/performance.md)",
    )
    max_model_len: int | None = setting(
        None, "cap on prompt + output tokens (default: the model's; at most what the KV pool holds)"
    )
    num_threads: int | None = setting(None, "torch CPU threads (default: torch's choice)")
    lora: tuple[str, ...] = setting(
        (), "NAME=PATH: serve the PEFT LoRA adapter in directory PATH as model NAME over the "
        "base model (repeatable; docs/lora.md)",
    )  # fmt: skip
    max_lora_rank: int = setting(64, "largest LoRA rank an adapter may have")
    engine_nice: int = setting(
        5,
        "niceness added to engine-core processes, so that the HTTP front end (refusals, "
        "/health, streaming) keeps precedence when they share cores; 0 to keep them equal",
    )

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.int8_matmuls not in ("auto", "on", "off"):
            raise ValueError(f"unknown int8_matmuls {self.int8_matmuls!r}")
        if self.gguf_blocks not in ("auto", "off"):
            raise ValueError(f"unknown gguf_blocks {self.gguf_blocks!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown device {self.device!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be positive")
        if not 0 <= self.engine_nice <= 19:
            raise ValueError("engine_nice must be in 0..19")
        object.__setattr__(self, "lora", tuple(self.lora or ()))  # argparse appends to a list
        if not 1 <= self.max_lora_rank <= 1024:
            raise ValueError("max_lora_rank must be in 1..1024")
        for item in self.lora:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora {item!r}: expected NAME=PATH")

    @property
    def lora_paths(self) -> dict[str, str]:
        """--lora NAME=PATH as {NAME: PATH}."""
        return dict(item.partition("=")[::2] for item in self.lora)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = setting(16, "tokens per KV-cache block")
    kv_cache_memory_gb: float | None = setting(
        None, "memory for the paged KV cache, GiB (default: 1 on the CPU; on CUDA what "
        "--gpu-memory-utilization leaves once the weights are in)",
    )  # fmt: skip
    gpu_memory_utilization: float = setting(
        0.9, "CUDA: share of the device's memory this server may fill (weights, KV, work)"
    )
    num_kv_blocks: int | None = setting(
        None, "exact number of KV blocks (overrides the memory budget)"
    )
    enable_prefix_caching: bool = setting(
        True, "reuse the KV blocks of a prompt prefix seen before (within one tenant's salt)"
    )

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be positive")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ValueError("kv_cache_memory_gb must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be positive")


CPU_MAX_NUM_SEQS = 64  # past it a 2-core step grows longer than streams tolerate
CUDA_MAX_NUM_SEQS = 256  # as vLLM: a GPU step costs about the same up to hundreds of rows


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = setting(2048, "token budget of one model step")
    burst_batched_tokens: int | None = setting(
        None, "token budget a step grows to while prompts back up (default: no growth)"
    )
    max_num_seqs: int | None = setting(
        None, f"most requests running at once (default: {CPU_MAX_NUM_SEQS} on the CPU, "
        f"{CUDA_MAX_NUM_SEQS} on CUDA)",
    )  # fmt: skip
    num_speculative_tokens: int = setting(
        8, "draft tokens a greedy request checks per step, found by prompt lookup (0: off)"
    )
    speculative_max_seqs: int = setting(4, "speculate only while at most this many requests run")
    policy: str = setting("continuous", "continuous | static (for comparison)")
    static_batch_size: int = setting(16, "static policy: requests per batch")
    static_wait_ms: float = setting(20.0, "static policy: longest wait to fill a batch, ms")
    max_preemptions: int = setting(
        8, "preemptions of one request for priority, at most (anti-thrash)"
    )
    max_loras: int = setting(4, "most LoRA adapters in one step; requests of more wait their turn")
    max_cpu_loras: int | None = setting(
        None, "most LoRA adapters holding their weights in memory (>= --max-loras); the others "
        "stay served and are read again from disk when a request needs them, evicting the least "
        "recently used one no running request uses (default: every adapter stays in memory; "
        "docs/lora.md)",
    )  # fmt: skip
    async_scheduling: bool = setting(
        False,
        "schedule and launch each step before the last one's tokens are read, so the host's "
        "work runs while the device computes (steps with drafts or grammars run in series; "
        "docs/engine.md)",
    )
    background_priority: int = setting(
        2, "requests this urgent or less (the batch tier's) sit out each step that computes a "
        "more urgent request's prompt (10: never)",
    )  # fmt: skip

    @property
    def seqs_limit(self) -> int:
        """max_num_seqs, the CPU's default when unset (`for_device` sets a device's)."""
        return CPU_MAX_NUM_SEQS if self.max_num_seqs is None else self.max_num_seqs

    def for_device(self, device_type: str) -> SchedulerConfig:
        """This config with max_num_seqs set: the user's, else the device's default."""
        if self.max_num_seqs is not None:
            return self
        seqs = CUDA_MAX_NUM_SEQS if device_type == "cuda" else CPU_MAX_NUM_SEQS
        return dataclasses.replace(self, max_num_seqs=seqs)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or (self.max_num_seqs or 1) < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        if self.burst_batched_tokens is not None and self.burst_batched_tokens < 1:
            raise ValueError("burst_batched_tokens must be positive")
        if self.num_speculative_tokens < 0 or self.speculative_max_seqs < 0:
            raise ValueError("num_speculative_tokens and speculative_max_seqs must be >= 0")
        if self.max_loras < 1:
            raise ValueError("max_loras must be positive")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(  # a step's adapters must all fit in memory at once
                f"--max-cpu-loras {self.max_cpu_loras} is below --max-loras {self.max_loras}: "
                "the adapters of one step must all be in memory"
            )
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"unknown scheduler policy {self.policy!r}")
