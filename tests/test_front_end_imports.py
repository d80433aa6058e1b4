"""The HTTP front end's process does not load torch: only the engine core's process computes
(a server is ready ~1.4 s sooner, and the front end's memory stays small). Checked in a fresh
interpreter, as `headrace serve` starts."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_server_command_loads_no_torch() -> None:
    probe = (
        "import sys, headrace.cli, headrace.commands.serve, headrace.api.app; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout[:500]
