"""API keys: find the key in the headers, hash it, find its tenant without leaking timing.

Only SHA-256 digests of keys are kept. The presented key's digest is compared with every
stored digest using `hmac.compare_digest`, and the loop never stops early, so the time taken
does not depend on which (if any) stored digest matches or on how much of it matches.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping


def hash_key(key: str) -> str:
    """The digest stored in the tenants file for `key`."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_from_headers(headers: Mapping[str, str]) -> str | None:
    """`Authorization: Bearer <key>` or `x-api-key: <key>`; header names in any case."""
    lowered = {k.lower(): v for k, v in headers.items()}
    auth = lowered.get("authorization", "").strip()
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    api_key = lowered.get("x-api-key", "").strip()
    return api_key or None


class KeyStore:
    """Maps key digests to owners (tenant names, or "admin")."""

    def __init__(self, owners: Iterable[tuple[str, str]]) -> None:
        # (digest bytes, owner); bytes so that compare_digest sees equal-length inputs
        self._entries = [(bytes.fromhex(digest), owner) for digest, owner in owners]

    def __len__(self) -> int:
        return len(self._entries)

    def owner(self, key: str | None) -> str | None:
        if key is None:
            return None
        presented = hashlib.sha256(key.encode("utf-8")).digest()
        found: str | None = None
        for digest, owner in self._entries:
            # No early exit: every stored digest is compared on every call.
            if hmac.compare_digest(presented, digest):
                found = owner
        return found
