"""Strings from clients that reach the tokenizer, a stop check or an error message.

JSON can carry a lone UTF-16 surrogate (`"\\ud800"`): Python decodes it into a `str` that no
UTF-8 encoder accepts, so the tokenizer (and any JSON answer echoing it) would fail deep inside
the server. Such a string is refused at the schema, naming the field; error messages are made
printable so that even an echoed bad key cannot break the error response itself.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _is_utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid_text(s: str) -> str:
    if not _is_utf8(s):
        bad = next(c for c in s if not _is_utf8(c))
        raise ValueError(
            f"contains a lone surrogate (\\u{ord(bad):04x}), which is not valid Unicode text"
        )
    return s


# A `str` field whose value must be valid Unicode (encodable as UTF-8).
Text = Annotated[str, AfterValidator(_valid_text)]


def printable(s: str) -> str:
    """`s` with anything UTF-8 cannot carry written as a `\\uXXXX` escape."""
    return s if _is_utf8(s) else s.encode("utf-8", "backslashreplace").decode("utf-8")
