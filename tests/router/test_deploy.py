"""Model specs on the command line, thread split, router settings (pure)."""

from __future__ import annotations

import pytest

from headrace.config import RouterConfig
from headrace.router.deploy import ModelSpec, parse_model_specs, threads_per_replica


def name_of(path: str | None) -> str:
    return "default" if path is None else path.rsplit("/", 1)[-1]


def test_one_model_takes_served_model_name_and_the_replica_default() -> None:
    assert parse_model_specs(["/m/a"], "tiny", 2, name_of) == [ModelSpec("/m/a", "tiny", 2)]
    assert parse_model_specs([None], None, 1, name_of) == [ModelSpec(None, "default", 1)]


def test_several_models_with_names_and_replica_counts() -> None:
    specs = parse_model_specs(["alpha=/m/a:3", "/m/b", "/m/c.gguf:0"], "ignored", 2, name_of)
    assert specs == [
        ModelSpec("/m/a", "alpha", 3),
        ModelSpec("/m/b", "b", 2),
        ModelSpec("/m/c.gguf", "c.gguf", 0),
    ]


def test_two_models_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="same name"):
        parse_model_specs(["/x/a", "/y/a"], None, 1, name_of)


def test_threads_are_split_between_replicas() -> None:
    assert threads_per_replica(2, cores=8) == 4
    assert threads_per_replica(3, cores=8) == 2
    assert threads_per_replica(16, cores=8) == 1


def test_router_config_is_validated() -> None:
    RouterConfig(long_prompt_threshold=256, long_replicas=1)
    with pytest.raises(ValueError, match="go together"):
        RouterConfig(long_prompt_threshold=256)
    with pytest.raises(ValueError, match="go together"):
        RouterConfig(long_replicas=1)
    with pytest.raises(ValueError, match="routing"):
        RouterConfig(routing="random")
    with pytest.raises(ValueError, match="negative"):
        RouterConfig(replicas=-1)
