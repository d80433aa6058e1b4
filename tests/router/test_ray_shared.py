"""Two `headrace serve` front ends sharing one set of Ray replicas (`--ray-namespace`): named,
detached actors that the first creates and the second attaches to. Both answer with the same
greedy text; a replica that dies is recreated once, not once per front end; a front end that
stops leaves the replicas to the other; `headrace ray-down` removes them; a tenant's token
limit holds across both front ends. On a one-node Ray cluster on 127.0.0.1, in a private
network namespace (`netns`)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, routed, running, serve_args, start_server, wait_for, write_tenants

from router.test_ray import LOOPBACK, recreated, texts

pytestmark = pytest.mark.netns
ray_cluster_utils = pytest.importorskip("ray.cluster_utils")

NAMESPACE = "team"
TENANTS_NAMESPACE = "tenants"  # its own: the limits pool (a detached actor) stays in it
NAMESPACES = (NAMESPACE, TENANTS_NAMESPACE)
NAMES = ["headrace/alpha/0", "headrace/alpha/1"]


@pytest.fixture(scope="module")
def one_node() -> Iterator[Any]:
    """One single-node cluster for the module (its start and stop are 4-5 s): each test works
    in a namespace of its own and removes its detached actors, so none sees another's."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    head = {"num_cpus": 2, "node_ip_address": LOOPBACK, "include_dashboard": False}
    cluster = ray_cluster_utils.Cluster(initialize_head=True, head_node_args=head)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def cluster(one_node: Any) -> Iterator[Any]:
    """The module's cluster, its replicas gone again after the test (even a failed one)."""
    yield one_node
    deadline = time.monotonic() + 10  # a passing test removed them: they may still be going
    while live_replicas(one_node) and time.monotonic() < deadline:
        time.sleep(0.05)
    if live_replicas(one_node):  # left by a failed test
        for namespace in NAMESPACES:
            ray_down(one_node, namespace)
        wait_for(lambda: not live_replicas(one_node), 30, "the replicas to be removed")


def shared_args(model: Path, cluster: Any) -> list[str]:
    return serve_args(
        f"alpha={model}:2",
        extra=("--ray-address", cluster.address, "--ray-namespace", NAMESPACE,
               "--num-threads", "1", "--max-num-seqs", "2", "--restart-backoff-s", "0.2"),
    )  # fmt: skip


def live_replicas(cluster: Any) -> dict[str, tuple[str, int]]:
    """Actor name -> (actor id, worker pid) of every live replica actor in the cluster."""
    table = cluster.global_state.actor_table(None).values()
    return {
        a["Name"]: (a["ActorID"], a["Pid"])
        for a in table
        if a["ActorClassName"] == "ReplicaActor" and a["State"] == "ALIVE"
    }


def ray_down(cluster: Any, namespace: str = NAMESPACE) -> str:
    cmd = [sys.executable, "-m", "headrace.cli", "ray-down", "--ray-address", cluster.address,
           "--ray-namespace", namespace]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_two_front_ends_share_one_set_of_replicas(
    tiny_models: dict[str, Path], tmp_path: Path, cluster: Any
) -> None:
    args = shared_args(tiny_models["alpha"], cluster)
    first: Server = start_server(args, tmp_path)
    try:
        first.wait_ready()
        actors = live_replicas(cluster)
        assert sorted(actors) == NAMES and all(a[1] > 0 for a in actors.values())
        with running(args, tmp_path) as second:
            assert live_replicas(cluster) == actors  # attached: nothing new created
            expected = texts(first.url)
            assert texts(second.url) == expected
            assert all(n >= 1 for n in routed(second.url, "alpha").values())

            os.kill(actors[NAMES[0]][1], signal.SIGKILL)  # a replica crashes
            both = (first, second)
            wait_for(lambda: all(recreated(s) for s in both), 60, "the replica to be back")
            after = live_replicas(cluster)
            assert sorted(after) == NAMES  # one new actor for both front ends
            assert after[NAMES[0]][0] != actors[NAMES[0]][0]
            assert after[NAMES[1]] == actors[NAMES[1]]
            assert texts(first.url) == texts(second.url) == expected
            assert first.stop() == 0, first.log()  # the first front end leaves
            assert live_replicas(cluster) == after
            assert texts(second.url) == expected
            assert recreated(second)  # no restart: the replicas were left running
    finally:
        first.stop()
    assert live_replicas(cluster) == after  # detached: they outlive every front end
    assert ray_down(cluster).split() == ["removed", NAMES[0], "removed", NAMES[1]]
    wait_for(lambda: not live_replicas(cluster), 30, "the replicas to be removed")


TPM = 400  # tokens per minute of tenant acme, shared by both front ends
KEY = "acme-key"


def limited_args(model: Path, cluster: Any, tenants: Path) -> list[str]:
    return serve_args(
        f"alpha={model}:1",
        extra=("--ray-address", cluster.address, "--ray-namespace", TENANTS_NAMESPACE,
               "--num-threads", "1", "--tenants", str(tenants)),
    )  # fmt: skip


def spend(urls: list[str], seconds: float) -> tuple[dict[str, int], int]:
    """Send requests of 20 tokens by turns to each front end for `seconds`: (requests
    admitted by each, tokens used in all)."""
    admitted = dict.fromkeys(urls, 0)
    used = 0
    headers = {"Authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + seconds
    with httpx.Client(headers=headers, timeout=30) as client:
        while time.monotonic() < deadline:
            for url in urls:
                b = {"model": "alpha", "prompt": "w5 w6 w7", "max_tokens": 16,
                     "temperature": 0, "ignore_eos": True}  # fmt: skip
                r = client.post(url + "/v1/generate", json=b)
                assert r.status_code in (200, 429), r.text
                if r.status_code == 200:
                    admitted[url] += 1
                    usage = r.json()["usage"]
                    used += usage["prompt_tokens"] + usage["completion_tokens"]
            time.sleep(0.02)
    return admitted, used


def test_a_tenants_limit_holds_across_front_ends(
    tiny_models: dict[str, Path], tmp_path: Path, cluster: Any
) -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    acme = f"  acme:\n    api_key_sha256: [{digest}]\n    tokens_per_minute: {TPM}\n"
    tenants = write_tenants(tmp_path, "tenants:\n" + acme)
    args = limited_args(tiny_models["alpha"], cluster, tenants)
    with running(args, tmp_path) as first, running(args, tmp_path) as second:
        t0 = time.monotonic()
        admitted, used = spend([first.url, second.url], 4.0)
        refill = TPM / 60 * (time.monotonic() - t0)
    ray_down(cluster, TENANTS_NAMESPACE)
    # Each alone would let TPM through: together, not much more than TPM.
    assert used <= TPM + refill + 20, (used, admitted)
    assert used >= TPM * 3 // 4 and min(admitted.values()) >= 3, (used, admitted)
