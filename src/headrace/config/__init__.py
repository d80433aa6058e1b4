"""Settings: one frozen dataclass per subsystem, composed into `HeadraceConfig`.

Each field's `metadata["help"]` becomes a CLI flag (`--max-num-seqs` for `max_num_seqs`) via
`add_config_args`; values are validated on construction.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from headrace.config.args import add_config_args, config_from_args
from headrace.config.engine import (
    CPU_MAX_NUM_SEQS,
    CUDA_MAX_NUM_SEQS,
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
)
from headrace.config.router import AutoscaleConfig, RouterConfig
from headrace.config.server import BatchConfig, GatewayConfig, LedgerConfig, ServerConfig

__all__ = [
    "CPU_MAX_NUM_SEQS",
    "CUDA_MAX_NUM_SEQS",
    "AutoscaleConfig",
    "BatchConfig",
    "CacheConfig",
    "GatewayConfig",
    "HeadraceConfig",
    "LedgerConfig",
    "ModelConfig",
    "RouterConfig",
    "SchedulerConfig",
    "ServerConfig",
    "add_config_args",
    "config_from_args",
]


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
