"""Where the admin key in clear comes from: `--admin-key`, `--admin-key-file` or the
environment variable `HEADRACE_ADMIN_KEY`, exactly one of them.

`--admin-key` is readable by every local user in the process list (`/proc/PID/cmdline`); the
file (mode 0600) and the environment (`/proc/PID/environ` is readable by the owner only) are
not. The file is read again on each reload, so the key can be rotated without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from headrace.config import GatewayConfig

ENV = "HEADRACE_ADMIN_KEY"


class AdminKeyError(ValueError):
    """Two sources at once, or a key file that cannot be used; the message says which."""


@dataclass(frozen=True)
class AdminKeySource:
    origin: str  # "--admin-key", "--admin-key-file" or ENV: for messages
    key: str | None = None  # the key itself (flag or environment)
    path: str | None = None  # the file holding it

    @classmethod
    def resolve(cls, cfg: GatewayConfig, environ: Mapping[str, str]) -> AdminKeySource | None:
        """The one source given, or None; AdminKeyError when there are several (none wins:
        a forgotten variable must not silently replace the key the operator typed)."""
        found = []
        if cfg.admin_key:
            found.append(cls("--admin-key", key=cfg.admin_key))
        if cfg.admin_key_file:
            found.append(cls("--admin-key-file", path=cfg.admin_key_file))
        if environ.get(ENV):
            found.append(cls(ENV, key=environ[ENV]))
        if len(found) > 1:
            given = ", ".join(s.origin for s in found)
            raise AdminKeyError(f"give the admin key one way, not several: {given} are all set")
        return found[0] if found else None

    @property
    def reloadable(self) -> bool:
        return self.path is not None

    def read(self) -> str:
        """The key; from the file, its content without surrounding whitespace."""
        if self.path is None:
            assert self.key is not None
            return self.key
        try:
            key = Path(self.path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise AdminKeyError(f"{self.path}: cannot read the admin key file: {reason}") from e
        if not key:
            raise AdminKeyError(f"{self.path}: the admin key file is empty")
        return key
