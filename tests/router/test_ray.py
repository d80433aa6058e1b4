"""Replicas as Ray actors (`--ray-address`) on a local two-node Ray cluster on 127.0.0.1, run
in a private network namespace (`netns`): one replica per node, the same greedy text as a
local-process replica, and the loss of a node under load — clients never hang, no request
fails (those that had not started finish elsewhere, started streams resume there with the text
of an undisturbed run), the replica comes back on the node that is left, no KV block leaks."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, replicas, running, serve_args, wait_for, word_prompt

pytestmark = pytest.mark.netns
ray_cluster_utils = pytest.importorskip("ray.cluster_utils")

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def one_cluster() -> Iterator[Any]:
    """A head and a worker node, 2 CPUs each (room for both replicas on either one); one for
    the module (its start and stop are 4-5 s)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    head = {"num_cpus": 2, "node_ip_address": LOOPBACK, "include_dashboard": False}
    cluster = ray_cluster_utils.Cluster(initialize_head=True, head_node_args=head)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def two_nodes(one_cluster: Any) -> Iterator[Any]:
    """The module's cluster with a worker node (a new one where a test removed it); after the
    test, the replica actors of its server are gone (a server that stops takes them)."""
    if not one_cluster.worker_nodes:
        one_cluster.add_node(num_cpus=2, node_ip_address=LOOPBACK)
    yield one_cluster
    wait_for(lambda: not alive_replicas(one_cluster), 30, "the test's replica actors to go")


def alive_replicas(cluster: Any) -> list[Any]:
    table = cluster.global_state.actor_table(None).values()
    return [a for a in table if a["ActorClassName"] == "ReplicaActor" and a["State"] == "ALIVE"]


def replica_nodes(cluster: Any) -> tuple[list[str], str]:
    """(the node of each live replica actor, the node of the server's Ray driver)."""
    alive = alive_replicas(cluster)
    drivers = {a["OwnerAddress"]["NodeID"] for a in alive}
    assert len(drivers) == 1, alive
    return sorted(a["Address"]["NodeID"] for a in alive), drivers.pop()


def ray_server_args(model: Path, cluster: Any) -> list[str]:
    return serve_args(
        f"alpha={model}:2",
        extra=("--ray-address", cluster.address, "--num-threads", "1", "--max-num-seqs", "2",
               "--restart-backoff-s", "0.2"),
    )  # fmt: skip


def body(max_tokens: int, words: int, start: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "alpha", "prompt": word_prompt(words, start), "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": stream,
    }  # fmt: skip


def texts(url: str) -> list[str]:
    """Greedy texts of a few prompts sent at once (so that least load spreads them)."""
    bodies = [body(24, words, start) for words, start in ((3, 5), (17, 40), (40, 300), (9, 7))]

    async def run() -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answers = await asyncio.gather(*(client.post("/v1/generate", json=b) for b in bodies))
        return [a.json()["text"] for a in answers]

    return asyncio.run(run())


def test_one_replica_per_node_with_the_local_replicas_output(
    tiny_models: dict[str, Path], tmp_path: Path, two_nodes: Any
) -> None:
    cluster = two_nodes
    with running(ray_server_args(tiny_models["alpha"], cluster), tmp_path) as server:
        nodes, _ = replica_nodes(cluster)
        assert len(set(nodes)) == 2, nodes  # spread: one per node
        on_ray = texts(server.url)
        served = {r["name"]: r["routed"] for r in replicas(server.url, "alpha")}
    assert all(n >= 1 for n in served.values()), served  # both replicas took requests
    with running(serve_args(f"alpha={tiny_models['alpha']}"), tmp_path) as local:
        assert texts(local.url) == on_ray


async def stream(client: httpx.AsyncClient, b: dict[str, Any], seen: list[int]) -> list[Any]:
    """The stream's JSON events; `seen` counts the streams that got their first one."""
    events: list[Any] = []
    async with client.stream("POST", "/v1/generate", json=b) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
                if len(events) == 1:
                    seen.append(1)
    return events


async def load_and_lose(server: Server, cluster: Any, victim: Any | None) -> list[list[Any]]:
    """8 streams; once 3 have begun, the victim's node goes (None: an undisturbed run)."""
    seen: list[int] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=90) as client:
        tasks = [
            asyncio.create_task(stream(client, body(300, 8, 10 * i, stream=True), seen))
            for i in range(8)
        ]  # 2 running and 2 waiting on each replica (--max-num-seqs 2)
        if victim is not None:
            while len(seen) < 3:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(cluster.remove_node, victim)
        return await asyncio.wait_for(asyncio.gather(*tasks), 60)


def text_of(events: list[Any]) -> str:
    return "".join(str(e.get("text", "")) for e in events)


def test_losing_a_node_under_load(
    tiny_models: dict[str, Path], tmp_path: Path, two_nodes: Any
) -> None:
    cluster = two_nodes
    with running(ray_server_args(tiny_models["alpha"], cluster), tmp_path) as server:
        nodes, driver = replica_nodes(cluster)
        victim = next(n for n in cluster.worker_nodes if n.node_id in nodes)
        assert victim.node_id != driver  # the server's Ray driver stays on its node
        reference = asyncio.run(load_and_lose(server, cluster, None))
        results = asyncio.run(load_and_lose(server, cluster, victim))
        finals = [events[-1] for events in results]
        # Every request finished: the waiting ones on the replica left, the started ones
        # resumed there, with the text and usage of the undisturbed run.
        assert all(f.get("finish_reason") == "length" for f in finals), finals
        assert [text_of(e) for e in results] == [text_of(e) for e in reference]
        assert [f["usage"] for f in finals] == [e[-1]["usage"] for e in reference]
        stats = httpx.get(server.url + "/v1/stats", timeout=10).json()["models"]["alpha"]
        assert stats["resumes"] >= 1 and stats["retries"] >= 1, stats
        wait_for(lambda: recreated(server), 60, "the lost replica to be recreated")
        assert replica_nodes(cluster)[0] == [driver, driver]  # both on the node left
        assert len(texts(server.url)) == 4
        wait_for(
            lambda: all(r["kv_blocks_used"] == 0 for r in replicas(server.url, "alpha")),
            10, "every KV block to be freed",
        )  # fmt: skip


def recreated(server: Server) -> bool:
    reps = replicas(server.url, "alpha")
    return all(r["state"] == "healthy" for r in reps) and sum(r["restarts"] for r in reps) == 1
