"""`headrace serve --ray-address local` (a private single-node Ray, run in a network namespace
with only loopback): after a request has gone through a Ray replica, every socket that any
process of the server's tree listens on — the API, Ray's GCS, raylet, object manager, workers —
is on loopback. Ray has no authentication of its own: what it listens on is the whole defence.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import httpx
import psutil
import pytest
from factories import running, serve_args

pytestmark = pytest.mark.netns
pytest.importorskip("ray")


def listeners(pid: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of each TCP listener and bound UDP socket of `pid`'s tree."""
    found: list[tuple[str, str, int]] = []
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            udp_bound = c.status == psutil.CONN_NONE and not c.raddr
            if c.status == psutil.CONN_LISTEN or udp_bound:
                found.append((name, c.laddr.ip, c.laddr.port))
    return found


def on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as Ray's gRPC binds
    return (mapped or ip).is_loopback


def test_every_listener_of_a_local_ray_server_is_on_loopback(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    args = serve_args(f"alpha={tiny_models['alpha']}:1", extra=("--ray-address", "local"))
    with running(args, tmp_path) as server:
        body = {"model": "alpha", "prompt": "one two three", "max_tokens": 4, "temperature": 0}
        r = httpx.post(server.url + "/v1/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        found = listeners(server.proc.pid)
    names = {name for name, _, _ in found}
    # The test sees Ray's own listeners, not only the API's: GCS and the raylet at least.
    assert {"gcs_server", "raylet"} <= names, found
    outside = [f for f in found if not on_loopback(f[1])]
    assert not outside, f"listening beyond loopback: {outside}\nall: {found}"
