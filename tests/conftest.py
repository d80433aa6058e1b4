"""Suite-wide pytest set-up, shared by every helper: only add to it.

Having this file puts `tests/` on `sys.path`, so helper modules of a test package import the
same way from anywhere in the suite: `from factories import make_tiny` (tests/factories/).
"""

pytest_plugins = ["netns"]
