"""Settings: one frozen dataclass per subsystem, composed into `HeadraceConfig`.

Each field's `metadata["help"]` becomes a CLI flag (`--max-num-seqs` for `max_num_seqs`) via
`add_config_args`; values are validated on construction.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ModelConfig:
    model: str | None = _f(None, "GGUF file or Hugging Face directory (default: Gemma 3 270M)")
    served_model_name: str | None = _f(None, "name clients use in `model` (default: derived)")
    dtype: str = _f(
        "auto",
        "float32 | bfloat16 | float16 | auto (bf16 on CUDA and CPUs with native bf16, else fp32)",
    )
    device: str = _f("auto", "cpu | cuda | auto")
    int8_matmuls: str = _f(
        "auto",
        "int8 layer matmuls (dynamic per-row activations) in steps of 32+ tokens: on | off | "
        "auto (on for bf16 on CPUs with int8 dot products, VNNI or AMX; docs/performance.md)",
    )
    deterministic: bool = _f(
        False,
        "batch-invariant greedy: a plain greedy request's tokens do not depend on its step's "
        "other requests, chunk sizes, prefix-cache hits or speculation (int8 matmuls off, one "
        "row-independent matmul, per-token attention; CPU bf16; docs/engine.md)",
    )
    max_model_len: int | None = _f(None, "cap on prompt + output tokens (default: model's)")
    num_threads: int | None = _f(None, "torch CPU threads (default: torch's choice)")
    lora: tuple[str, ...] = _f(
        (), "NAME=PATH: serve the PEFT LoRA adapter in directory PATH as model NAME over the "
        "base model (repeatable; docs/lora.md)",
    )  # fmt: skip
    max_lora_rank: int = _f(64, "largest LoRA rank an adapter may have")
    engine_nice: int = _f(
        5,
        "niceness added to engine-core processes, so that the HTTP front end (refusals, "
        "/health, streaming) keeps precedence when they share cores; 0 to keep them equal",
    )

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.int8_matmuls not in ("auto", "on", "off"):
            raise ValueError(f"unknown int8_matmuls {self.int8_matmuls!r}")
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
    block_size: int = _f(16, "tokens per KV-cache block")
    kv_cache_memory_gb: float | None = _f(
        None, "memory for the paged KV cache, GiB (default: 1 on the CPU; on CUDA what "
        "--gpu-memory-utilization leaves once the weights are in)",
    )  # fmt: skip
    gpu_memory_utilization: float = _f(
        0.9, "CUDA: share of the device's memory this server may fill (weights, KV, work)"
    )
    num_kv_blocks: int | None = _f(None, "exact number of KV blocks (overrides the memory budget)")
    enable_prefix_caching: bool = _f(
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
    max_num_batched_tokens: int = _f(2048, "token budget of one model step")
    burst_batched_tokens: int | None = _f(
        None, "token budget a step grows to while prompts back up (default: no growth)"
    )
    max_num_seqs: int | None = _f(
        None, f"most requests running at once (default: {CPU_MAX_NUM_SEQS} on the CPU, "
        f"{CUDA_MAX_NUM_SEQS} on CUDA)",
    )  # fmt: skip
    num_speculative_tokens: int = _f(
        8, "draft tokens a greedy request checks per step, found by prompt lookup (0: off)"
    )
    speculative_max_seqs: int = _f(4, "speculate only while at most this many requests run")
    policy: str = _f("continuous", "continuous | static (for comparison)")
    static_batch_size: int = _f(16, "static policy: requests per batch")
    static_wait_ms: float = _f(20.0, "static policy: longest wait to fill a batch, ms")
    max_preemptions: int = _f(8, "preemptions of one request for priority, at most (anti-thrash)")
    max_loras: int = _f(4, "most LoRA adapters in one step; requests of more wait their turn")

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
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"unknown scheduler policy {self.policy!r}")


@dataclass(frozen=True)
class ServerConfig:
    host: str = _f("127.0.0.1", "address to bind")
    port: int = _f(8000, "port to bind")
    request_timeout_s: float = _f(600.0, "default per-request timeout, seconds")
    max_body_bytes: int = _f(1_000_000, "largest request body accepted")
    max_header_bytes: int = _f(16_384, "largest request line + headers accepted; more get 431")
    header_timeout_s: float = _f(30.0, "a request's line and headers must arrive within this, s")
    body_timeout_s: float = _f(60.0, "a request's body must arrive within this after its head, s")
    max_connections: int = _f(1000, "most open client connections; more get 503 with Retry-After")
    send_timeout_s: float = _f(
        30.0, "a client that reads none of a response for this long is dropped, s"
    )
    http_parser: str = _f("httptools", "httptools (C) | h11 (pure Python): parses requests")
    log_level: str = _f("info", "debug | info | warning | error")
    otlp_traces_endpoint: str | None = _f(
        None, "OTLP/HTTP collector for request traces, e.g. http://127.0.0.1:4318/v1/traces"
    )
    allowed_hosts: str | None = _f(
        None, "Host header names answered besides localhost, IP addresses and --host, "
        "comma-separated (.example.com: it and its subdomains; *: any, behind a proxy); "
        "others get 421 (DNS rebinding)",
    )  # fmt: skip
    allowed_origins: str | None = _f(
        None, "browser origins (scheme://host[:port]) that may call this server, "
        "comma-separated, answered with CORS headers (*: any); other cross-origin requests "
        "get 403. Default: none",
    )  # fmt: skip
    api_docs: bool = _f(
        False, "serve the OpenAPI schema at /openapi.json (behind the admin key on a guarded "
        "server); off by default",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for origin in self.origin_list:
            if origin == "null":  # sandboxed frames and file: pages of any site send it
                raise ValueError("allowed_origins: 'null' would let any page's sandboxed frame in")
            if origin != "*" and "://" not in origin:
                raise ValueError(f"allowed_origins: {origin!r} is not scheme://host[:port]")
        for host in self.host_list:
            if "/" in host or " " in host:
                raise ValueError(f"allowed_hosts: {host!r} is not a host name")
        if min(self.max_body_bytes, self.max_header_bytes, self.max_connections) < 1:
            raise ValueError("body and header sizes and max_connections must be positive")
        if min(self.header_timeout_s, self.body_timeout_s, self.send_timeout_s) <= 0:
            raise ValueError("header_timeout_s, body_timeout_s and send_timeout_s must be positive")
        if self.http_parser not in ("httptools", "h11"):
            raise ValueError(f"unknown http_parser {self.http_parser!r}: httptools or h11")
        endpoint = self.otlp_traces_endpoint
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"otlp_traces_endpoint must be an http(s) URL, got {endpoint!r}")

    @property
    def host_list(self) -> list[str]:
        return _items(self.allowed_hosts)

    @property
    def origin_list(self) -> list[str]:
        return _items(self.allowed_origins)


@dataclass(frozen=True)
class GatewayConfig:
    tenants: str | None = _f(None, "tenants file (.yaml or .toml): API keys, tiers, limits")
    max_queued_requests: int | None = _f(
        None, "most requests waiting at a priority and above; then 503 for a tenant at its share"
    )
    max_queued_tokens: int | None = _f(
        None, "most tokens (prompt + max_tokens) waiting; then 503 for a tenant at its share"
    )
    admin_key: str | None = _f(
        None, "key that /metrics, /v1/stats, /v1/replica/* and /admin/* require (or "
        "admin_key_sha256); visible in the process list: prefer --admin-key-file or "
        "HEADRACE_ADMIN_KEY",
    )  # fmt: skip
    admin_key_file: str | None = _f(
        None, "file holding the admin key (read again on reload); instead of --admin-key"
    )
    replica_api: bool = _f(
        False, "without --tenants or an admin key: serve /v1/replica/* (to anyone) anyway"
    )
    queue_timeout_s: float = _f(
        60.0, "queue deadline (s from HTTP arrival) where the tenant or tier sets none; then 503"
    )

    def __post_init__(self) -> None:
        for name in ("max_queued_requests", "max_queued_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive")
        if not self.queue_timeout_s > 0:
            raise ValueError("queue_timeout_s must be positive")


@dataclass(frozen=True)
class RouterConfig:
    replicas: int = _f(1, "engine processes per model (a --model NAME=PATH:N sets its own)")
    routing: str = _f(
        "cache-aware", "cache-aware (least-load but for prefix affinity) | least-load | "
        "power-of-two | round-robin",
    )  # fmt: skip
    cache_aware_margin_tokens: int = _f(
        4096, "cache-aware: keep a prefix on its replica while that replica's load (tokens) is "
        "at most this much above the least loaded one's",
    )  # fmt: skip
    long_prompt_threshold: int | None = _f(
        None, "prompts longer than this many tokens go to the long-prompt replicas"
    )
    long_replicas: int = _f(0, "extra replicas per model that take only the long prompts")
    restart_backoff_s: float = _f(0.5, "first wait before restarting a failed replica, seconds")
    restart_backoff_max_s: float = _f(30.0, "longest wait between restarts, seconds")
    replica_stall_timeout_s: float = _f(
        30.0, "a replica that reports nothing for this long is killed and restarted"
    )
    replica_api_key: str | None = _f(None, "key sent to --replica-url servers (their admin key)")
    replica_read_timeout_s: float = _f(
        30.0, "a --replica-url stream silent this long (keep-alives every 2 s) fails, seconds"
    )
    max_resumes: int = _f(
        2, "times a stream whose replica died is continued on another replica (0: it fails)"
    )
    resume_wait_s: float = _f(
        30.0, "how long a stream to resume waits for a replica in rotation, seconds"
    )
    ray_address: str | None = _f(
        None, "replicas as actors on a Ray cluster: auto | ray://HOST:PORT | HOST:PORT | local "
        "(a private single-node Ray); needs headrace[ray] (docs/scale-out.md)",
    )  # fmt: skip
    ray_namespace: str | None = _f(
        None, "with --ray-address: replicas are named, detached actors in this Ray namespace, "
        "shared by every front end started with the same one; `headrace ray-down` removes them",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.long_replicas < 0:
            raise ValueError("replicas and long_replicas must not be negative")
        if self.cache_aware_margin_tokens < 0:
            raise ValueError("cache_aware_margin_tokens must not be negative")
        if self.routing not in ("cache-aware", "least-load", "power-of-two", "round-robin"):
            raise ValueError(f"unknown routing policy {self.routing!r}")
        if (self.long_prompt_threshold is None) != (self.long_replicas == 0):
            raise ValueError("--long-prompt-threshold and --long-replicas go together")
        if self.long_prompt_threshold is not None and self.long_prompt_threshold < 1:
            raise ValueError("long_prompt_threshold must be positive")
        if self.restart_backoff_s <= 0 or self.restart_backoff_max_s < self.restart_backoff_s:
            raise ValueError("restart backoff must be positive, its maximum at least the first")
        if self.replica_stall_timeout_s <= 0:
            raise ValueError("replica_stall_timeout_s must be positive")
        if not self.replica_read_timeout_s > 0:
            raise ValueError("replica_read_timeout_s must be positive")
        if self.max_resumes < 0 or not self.resume_wait_s >= 0:
            raise ValueError("max_resumes and resume_wait_s must not be negative")
        if self.ray_namespace is not None and self.ray_address is None:
            raise ValueError("--ray-namespace needs --ray-address")


@dataclass(frozen=True)
class AutoscaleConfig:
    autoscale: str | None = _f(
        None, "MIN:MAX: keep each local model's replica count within these bounds, scaled on "
        "forecast demand (docs/autoscale.md); unset: the count is fixed",
    )  # fmt: skip
    autoscale_replica_tokens_per_s: float | None = _f(
        None, "output tokens/s one replica sustains within the SLO (`headrace plan`); unset: "
        "learned while requests queue",
    )  # fmt: skip
    autoscale_headroom: float = _f(0.2, "spare capacity kept above the forecast, as a fraction")
    autoscale_horizon_s: float = _f(
        300.0, "how far past a replica's start time the forecast peak is taken, seconds"
    )
    autoscale_cooldown_s: float = _f(
        600.0, "a replica is removed only after the forecast stayed low this long, seconds"
    )
    autoscale_start_s: float = _f(30.0, "replica start time assumed until one is measured, seconds")
    autoscale_interval_s: float = _f(10.0, "demand sample spacing and decision interval, s")

    def __post_init__(self) -> None:
        self.bounds  # noqa: B018  (validates the text)
        if self.autoscale_replica_tokens_per_s is not None and not (
            self.autoscale_replica_tokens_per_s > 0
        ):
            raise ValueError("--autoscale-replica-tokens-per-s must be positive")
        if not 0 <= self.autoscale_headroom <= 10:
            raise ValueError("--autoscale-headroom must be in [0, 10]")
        for name in ("horizon_s", "cooldown_s", "start_s"):
            if not getattr(self, "autoscale_" + name) >= 0:
                raise ValueError(f"--autoscale-{name.replace('_', '-')} must not be negative")
        if not self.autoscale_interval_s > 0:
            raise ValueError("--autoscale-interval-s must be positive")

    @property
    def bounds(self) -> tuple[int, int] | None:
        """(MIN, MAX), or None when autoscaling is off."""
        if self.autoscale is None:
            return None
        lo, sep, hi = self.autoscale.partition(":")
        if not sep or not lo.isdigit() or not hi.isdigit() or not 1 <= int(lo) <= int(hi):
            raise ValueError(
                f"--autoscale must be MIN:MAX with 1 <= MIN <= MAX, got {self.autoscale!r}"
            )
        return int(lo), int(hi)


@dataclass(frozen=True)
class LedgerConfig:
    ledger: str | None = _f(
        None, "usage and audit ledger: an SQLite file (default: ledger.db in the state "
        "directory, $HEADRACE_STATE) or a postgresql:// URL; off, or --no-ledger: none "
        "(docs/ledger.md)",
    )  # fmt: skip
    ledger_flush_s: float = _f(1.0, "the ledger's records are written in batches this often, s")
    ledger_max_pending: int = _f(
        100_000, "records held in memory while the ledger cannot be written; more are dropped"
    )

    def __post_init__(self) -> None:
        if self.ledger_flush_s <= 0 or self.ledger_max_pending < 1:
            raise ValueError("ledger_flush_s and ledger_max_pending must be positive")

    @property
    def enabled(self) -> bool:
        return self.ledger != "off"


@dataclass(frozen=True)
class BatchConfig:
    batch_dir: str | None = _f(
        None, "where /v1/files and /v1/batches keep their files and jobs (default: batches/ in "
        "the state directory, $HEADRACE_STATE); off: no Batch API (docs/batches.md)",
    )  # fmt: skip
    batch_max_file_bytes: int = _f(100_000_000, "largest file accepted by POST /v1/files, bytes")
    batch_max_lines: int = _f(50_000, "most requests in one batch input file")
    batch_concurrency: int = _f(4, "batch lines in flight at once, over all batches")

    def __post_init__(self) -> None:
        if min(self.batch_max_file_bytes, self.batch_max_lines, self.batch_concurrency) < 1:
            raise ValueError("the batch file size, line count and concurrency must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.batch_dir != "off"


@dataclass(frozen=True)
class HeadraceConfig:
    """Every subsystem's settings in one value: built once from the command line and passed
    down whole (the deployment takes what it needs from it)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HeadraceConfig:
        return cls(
            config_from_args(ModelConfig, args), config_from_args(CacheConfig, args),
            config_from_args(SchedulerConfig, args), config_from_args(ServerConfig, args),
            config_from_args(GatewayConfig, args), config_from_args(RouterConfig, args),
            config_from_args(AutoscaleConfig, args), config_from_args(LedgerConfig, args),
            config_from_args(BatchConfig, args),
        )  # fmt: skip


C = TypeVar("C")


def _items(text: str | None) -> list[str]:
    """A comma-separated flag's items, stripped, the empty ones left out."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def add_config_args(
    parser: argparse.ArgumentParser, cls: type[Any], skip: tuple[str, ...] = ()
) -> None:
    """Add one `--flag` per field of the dataclass `cls` (but the fields named in `skip`)."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _field_type(f)
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata.get("help", "")}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif str(f.type).startswith("tuple"):  # a repeatable flag
            kwargs.update(action="append", type=str, default=None)
        else:
            kwargs["type"] = kind
        parser.add_argument(flag, dest=f.name, **kwargs)


def config_from_args(cls: type[C], args: argparse.Namespace) -> C:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def _field_type(f: dataclasses.Field[Any]) -> type:
    text = str(f.type)
    for name, kind in (("bool", bool), ("int", int), ("float", float)):
        if text.startswith(name):
            return kind
    return str
