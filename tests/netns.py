"""Run tests that start a browser or Ray inside a private network namespace.

Both reach for outside addresses on their own (update checks, safe browsing, cloud metadata,
8.8.8.8). A test marked `@pytest.mark.netns` is re-run, alone, in a child pytest inside
`unshare -n` with only loopback up, so nothing it starts can leave the machine; the outer run
reports the child's outcome. Where no namespace can be made (not root, no `unshare`), the test
is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

INSIDE = "HEADRACE_IN_NETNS"


def inside() -> bool:
    return os.environ.get(INSIDE) == "1"


def namespace_problem() -> str | None:
    """Why no private namespace can be made here, or None."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "no unshare/ip on this machine"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        return f"cannot make a network namespace: {probe.stderr.decode().strip()}"
    return None


def run_inside(nodeid: str, rootdir: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one test node in a fresh namespace with only loopback; returns the finished child."""
    env = dict(os.environ, **{INSIDE: "1"})
    inner = f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider " + (
        f"'{nodeid}'"
    )
    return subprocess.run(
        ["unshare", "-n", "sh", "-c", inner],
        cwd=rootdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "netns: run in a private network namespace with only loopback (re-run inside)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is None or inside():
        return
    problem = namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    done = run_inside(item.nodeid, str(item.config.rootpath), timeout=600)
    tail = (done.stdout + done.stderr)[-6000:]
    if done.returncode == 5 or " skipped" in done.stdout and " passed" not in done.stdout:
        pytest.skip(f"skipped inside the namespace:\n{tail}")
    if done.returncode != 0:
        pytest.fail(f"failed inside the network namespace (rc {done.returncode}):\n{tail}", False)
    # Passed inside: replace the outer call with nothing.
    item.runtest = lambda: None  # type: ignore[method-assign]
