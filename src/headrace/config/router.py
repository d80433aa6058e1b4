"""Replicas, routing between them and the autoscaler that sizes their pool."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.config.fields import setting


@dataclass(frozen=True)
class RouterConfig:
    replicas: int = setting(1, "engine processes per model (a --model NAME=PATH:N sets its own)")
    routing: str = setting(
        "cache-aware", "cache-aware (least-load but for prefix affinity) | least-load | "
        "power-of-two | round-robin",
    )  # fmt: skip
    cache_aware_margin_tokens: int = setting(
        4096, "cache-aware: keep a prefix on its replica while that replica's load (tokens) is "
        "at most this much above the least loaded one's",
    )  # fmt: skip
    long_prompt_threshold: int | None = setting(
        None, "prompts longer than this many tokens go to the long-prompt replicas"
    )
    long_replicas: int = setting(0, "extra replicas per model that take only the long prompts")
    restart_backoff_s: float = setting(
        0.5, "first wait before restarting a failed replica, seconds"
    )
    restart_backoff_max_s: float = setting(30.0, "longest wait between restarts, seconds")
    replica_stall_timeout_s: float = setting(
        30.0, "a replica that reports nothing for this long is killed and restarted"
    )
    replica_api_key: str | None = setting(
        None, "key sent to --replica-url servers (their admin key)"
    )
    replica_read_timeout_s: float = setting(
        30.0, "a --replica-url stream silent this long (keep-alives every 2 s) fails, seconds"
    )
    max_resumes: int = setting(
        2, "times a stream whose replica died is continued on another replica (0: it fails)"
    )
    resume_wait_s: float = setting(
        30.0, "how long a stream to resume waits for a replica in rotation, seconds"
    )
    ray_address: str | None = setting(
        None, "replicas as actors on a Ray cluster: auto | ray://HOST:PORT | HOST:PORT | local "
        "(a private single-node Ray); needs headrace[ray] (docs/scale-out.md)",
    )  # fmt: skip
    ray_namespace: str | None = setting(
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
    autoscale: str | None = setting(
        None, "MIN:MAX: keep each local model's replica count within these bounds, scaled on "
        "forecast demand (docs/autoscale.md); unset: the count is fixed",
    )  # fmt: skip
    autoscale_replica_tokens_per_s: float | None = setting(
        None, "output tokens/s one replica sustains within the SLO (`headrace plan`); unset: "
        "learned while requests queue",
    )  # fmt: skip
    autoscale_headroom: float = setting(
        0.2, "spare capacity kept above the forecast, as a fraction"
    )
    autoscale_horizon_s: float = setting(
        300.0, "how far past a replica's start time the forecast peak is taken, seconds"
    )
    autoscale_cooldown_s: float = setting(
        600.0, "a replica is removed only after the forecast stayed low this long, seconds"
    )
    autoscale_start_s: float = setting(
        30.0, "replica start time assumed until one is measured, seconds"
    )
    autoscale_interval_s: float = setting(10.0, "demand sample spacing and decision interval, s")

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
