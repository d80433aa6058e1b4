"""What the ledger keeps: a `UsageRecord` per finished request, an `AuditEntry` per admin
action; the key id that names a key without revealing it; the redaction of secrets."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

KEY_ID_CHARS = 12  # of the key's SHA-256, in hex: the start of its tenants-file digest
REDACTED = "[redacted]"
_SECRET_WORDS = ("key", "secret", "token", "password", "authorization")


def key_id(key: str | None) -> str | None:
    """A short name for an API key: the first hex digits of its SHA-256 (the digest that the
    tenants file stores), never the key; None without a key."""
    if not key:
        return None
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:KEY_ID_CHARS]


@dataclass(frozen=True)
class UsageRecord:
    """One finished request (any route, any outcome): who, what it cost, how it went."""

    tenant: str
    model: str | None  # the base model (an adapter's parent)
    route: str
    http_status: int
    request_id: str | None = None
    key_id: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    completion_tokens: int = 0  # all `n` choices together
    recomputed_tokens: int = 0  # KV entries thrown away by preemptions and computed again
    draft_tokens: int = 0  # speculative tokens proposed
    accepted_tokens: int = 0  # ... and accepted
    n: int = 1
    queue_s: float | None = None
    ttft_s: float | None = None
    total_s: float | None = None
    finish_reason: str | None = None
    replica: str | None = None
    resumed: bool = False
    time: float = field(default_factory=time.time)  # when it finished, Unix seconds
    # the LoRA adapter the request named (None: the base model); last, so that an export's
    # columns before it keep their places (schema version 2)
    adapter: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class AuditEntry:
    """One admin action: who (the admin key's id), what, with which arguments, and how it went."""

    action: str
    key_id: str | None
    arguments: Mapping[str, Any]
    status: int
    result: Mapping[str, Any]
    time: float = field(default_factory=time.time)


USAGE_COLUMNS = tuple(f.name for f in fields(UsageRecord))
AUDIT_COLUMNS = tuple(f.name for f in fields(AuditEntry))


def redact(value: Any) -> Any:
    """`value` with every mapping entry whose name suggests a secret replaced, at any depth."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED if _secret(str(k)) else redact(v) for k, v in value.items()
        }  # fmt: skip
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def _secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS) and not lowered.endswith("_id")
