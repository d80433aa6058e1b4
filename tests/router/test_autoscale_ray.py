"""`--autoscale` with replicas as Ray actors (`--ray-address local`, a private single-node Ray
in a network namespace with only loopback): the autoscaler adds an actor under load, it
serves, and it is drained and removed when idle, exactly as with local processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from router.test_autoscale_serve import scale_up_and_down

pytestmark = pytest.mark.netns
pytest.importorskip("ray")


def test_autoscale_starts_and_removes_ray_actors(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    scale_up_and_down(tiny_models["alpha"], tmp_path, ("--ray-address", "local"))
