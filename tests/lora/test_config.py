"""`--lora NAME=PATH` (repeatable), `--max-lora-rank`, `--max-loras`: parsed and checked
before anything loads."""

from __future__ import annotations

import argparse

import pytest

from headrace.commands.serve import add_arguments, check_lora_names
from headrace.config import HeadraceConfig, ModelConfig, SchedulerConfig


def test_flags_reach_the_configs() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--lora", "a=/x/a", "--lora", "b=/x/b", "--max-lora-rank", "16", "--max-loras", "2"]
    )
    config = HeadraceConfig.from_args(args)
    assert config.model.lora_paths == {"a": "/x/a", "b": "/x/b"}
    assert config.model.max_lora_rank == 16 and config.scheduler.max_loras == 2
    assert HeadraceConfig.from_args(parser.parse_args([])).model.lora == ()


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="expected NAME=PATH"):
        ModelConfig(lora=("just-a-path",))
    with pytest.raises(ValueError, match="max_lora_rank"):
        ModelConfig(max_lora_rank=0)
    with pytest.raises(ValueError, match="max_loras"):
        SchedulerConfig(max_loras=0)
    with pytest.raises(ValueError, match="one base model"):
        check_lora_names({"a": "/a"}, ["m1", "m2"])
    with pytest.raises(ValueError, match="the base model's"):
        check_lora_names({"m1": "/a"}, ["m1"])
    with pytest.raises(ValueError, match="adapter name"):
        check_lora_names({"a b": "/a"}, ["m1"])
    check_lora_names({"a": "/a"}, ["m1"])
