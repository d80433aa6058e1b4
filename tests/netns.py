"""Run tests that start a browser or Ray inside a private network namespace.

Both reach for outside addresses on their own (update checks, safe browsing, cloud metadata,
8.8.8.8). A test marked `@pytest.mark.netns` runs in a child pytest inside `unshare -n` with
only loopback up, so nothing it starts can leave the machine: the outer run sets up none of
its fixtures (no browser or Ray starts outside) and reports the child's outcome. One child runs
all the marked tests of a module (one interpreter start; module fixtures shared as in a plain
run). Where no namespace can be made (not root, no `unshare`), the test is skipped with the
reason.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

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


def run_inside(
    nodeids: list[str], rootdir: str, timeout: float, report: Path
) -> subprocess.CompletedProcess[str]:
    """Run test nodes in one fresh namespace with only loopback, their outcomes written to
    `report` (JUnit XML); returns the finished child."""
    env = dict(os.environ, **{INSIDE: "1"})
    quoted = " ".join(shlex.quote(n) for n in nodeids)
    inner = (
        f"ip link set lo up && exec {shlex.quote(sys.executable)} -m pytest -q "
        f"-p no:cacheprovider --junitxml={shlex.quote(str(report))} {quoted}"
    )
    return subprocess.run(
        ["unshare", "-n", "sh", "-c", inner],
        cwd=rootdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """Test name within its module ("test_x[p]" or "TestY::test_x") -> (passed / failed /
    skipped, the message), from the child's JUnit XML."""
    found: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        name = f"{cls}::{case.get('name')}" if cls[:1].isupper() else str(case.get("name"))
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, text = "failed", f"{child.get('message', '')}\n{child.text or ''}"
                break
            if child.tag == "skipped":
                outcome, text = "skipped", child.get("message", "")
        found[name] = (outcome, text)
    return found


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "netns: run in a private network namespace with only loopback (re-run inside)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Outside, a marked test sets nothing up: its fixtures (a browser, a Ray cluster) start
    inside the namespace only, where the test runs."""
    if inside():
        return
    for item in items:
        if item.get_closest_marker("netns") is not None and isinstance(item, pytest.Function):
            item.fixturenames = []


_RESULTS: dict[Path, tuple[dict[str, tuple[str, str]], str]] = {}


def _module_outcomes(item: pytest.Item) -> tuple[dict[str, tuple[str, str]], str]:
    """The outcomes of every marked test of item's module, run together in one child (one
    interpreter start, and the module's fixtures shared as in a plain run); the child's tail."""
    if item.path not in _RESULTS:
        ids = [
            i.nodeid
            for i in item.session.items
            if i.path == item.path and i.get_closest_marker("netns") is not None
        ]
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.xml"
            done = run_inside(ids, str(item.config.rootpath), 600 * len(ids), report)
            tail = (done.stdout + done.stderr)[-6000:]
            found = outcomes(report) if report.exists() else {}
        _RESULTS[item.path] = (found, f"(rc {done.returncode}):\n{tail}")
    return _RESULTS[item.path]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is None or inside():
        return
    problem = namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    found, tail = _module_outcomes(item)
    outcome, text = found.get(item.nodeid.split("::", 1)[1], ("missing", ""))
    if outcome == "skipped":
        pytest.skip(f"skipped inside the namespace: {text}")
    if outcome != "passed":
        pytest.fail(f"{outcome} inside the network namespace: {text[-4000:]}\n{tail}", False)
    # Passed inside: replace the outer call with nothing.
    item.runtest = lambda: None  # type: ignore[method-assign]
