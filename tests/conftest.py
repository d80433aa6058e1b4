"""Suite-wide pytest set-up, shared by every helper: only add to it.

Having this file puts `tests/` on `sys.path`, so helper modules of a test package import the
same way from anywhere in the suite: `from factories import make_tiny` (tests/factories/).
"""

pytest_plugins = ["netns", "hf_gemma"]


def pytest_configure(config: object) -> None:
    """Servers the tests start keep their usage ledger (on by default, in the state directory)
    in a directory of this run, never in the user's ~/.local/state."""
    import os
    import tempfile

    if "HEADRACE_STATE" not in os.environ:
        os.environ["HEADRACE_STATE"] = tempfile.mkdtemp(prefix="headrace-test-state-")
