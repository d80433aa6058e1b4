"""The `netns` marker: a marked test runs in a namespace where only loopback exists."""

from __future__ import annotations

import socket
import subprocess

import pytest
from netns import inside


@pytest.mark.netns
def test_marked_test_runs_with_only_loopback() -> None:
    assert inside()
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True)
    assert routes.stdout.strip() == ""  # no default route: nothing beyond loopback exists
    # Loopback works inside.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
