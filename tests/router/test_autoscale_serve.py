"""`headrace serve --autoscale 1:2` as a real server on 127.0.0.1: under load it starts a
second replica, which then serves; once the load is gone (past a short cool-down) it drains
and stops it again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import running, serve_args, wait_for, word_prompt


def model_stats(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(url + "/v1/stats", timeout=10).json()["models"]["alpha"]
    return stats


def test_autoscale_adds_a_replica_under_load_and_removes_it_after(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    scale_up_and_down(tiny_models["alpha"], tmp_path, ())


def scale_up_and_down(model: Path, tmp_path: Path, extra: tuple[str, ...]) -> None:
    """Load starts a second replica, which serves; idle, it is drained and removed."""
    args = serve_args(
        f"alpha={model}",
        extra=(
            "--max-num-seqs", "2", "--autoscale", "1:2",
            "--autoscale-replica-tokens-per-s", "20",  # the tiny model makes far more
            "--autoscale-interval-s", "0.5", "--autoscale-start-s", "0",
            "--autoscale-horizon-s", "1", "--autoscale-cooldown-s", "2", *extra,
        ),
    )  # fmt: skip
    with running(args, tmp_path) as server:
        url = server.url
        assert [r["name"] for r in model_stats(url)["replicas"]] == ["alpha/0"]

        async def load(stop: asyncio.Event) -> int:
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:

                async def client(i: int) -> int:
                    done = 0
                    while not stop.is_set():
                        body = {"model": "alpha", "prompt": word_prompt(8, 5 + i), "max_tokens": 32,
                                "temperature": 0, "ignore_eos": True}  # fmt: skip
                        r = await c.post("/v1/generate", json=body)
                        assert r.status_code == 200, r.text
                        done += 1
                    return done

                return sum(await asyncio.gather(*(client(i) for i in range(3))))

        async def scale_up() -> tuple[int, dict[str, Any]]:
            stop = asyncio.Event()
            task = asyncio.create_task(load(stop))

            def two_serving() -> bool:
                reps = model_stats(url)["replicas"]
                return len(reps) == 2 and all(r["state"] == "healthy" for r in reps)

            def new_one_routed() -> bool:
                reps = model_stats(url)["replicas"]
                return any(r["name"] == "alpha/1" and r["routed"] > 0 for r in reps)

            await asyncio.to_thread(wait_for, two_serving, 60, "a second replica")
            # the new one takes its share (asserted below): no fixed wait for it
            await asyncio.to_thread(wait_for, new_one_routed, 30, "the new replica to serve")
            stats = await asyncio.to_thread(model_stats, url)
            stop.set()
            return await task, stats

        done, stats = asyncio.run(scale_up())
        assert done > 0
        assert stats["autoscaler"]["started"] == 1 and stats["autoscaler"]["max"] == 2
        new = next(r for r in stats["replicas"] if r["name"] == "alpha/1")
        assert new["routed"] > 0  # it serves

        def back_to_one() -> bool:
            stats = model_stats(url)
            reps = stats["replicas"]
            return (
                stats["autoscaler"]["removed"] == 1
                and len(reps) == 1
                and (reps[0]["kv_blocks_used"] == 0 and reps[0]["state"] == "healthy")
            )

        wait_for(back_to_one, 30, "the idle replica to be removed")


@pytest.mark.parametrize("text", ["2", "0:2", "3:2", "a:b"])
def test_a_bad_autoscale_range_is_refused(text: str) -> None:
    from headrace.config import AutoscaleConfig

    with pytest.raises(ValueError, match="MIN:MAX"):
        AutoscaleConfig(autoscale=text)
