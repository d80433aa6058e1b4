"""An adapter's name and the error for one that cannot be served: what the HTTP front end and
the command line check without loading torch (the front end's process never needs it)."""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class LoraError(ValueError):
    """An adapter that cannot be served: the message says which file and why."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LoraError(
            f"adapter name {name!r}: 1-128 letters, digits or ._:/- (starting with a letter "
            "or digit)"
        )
    return name
