"""Refuse requests that a browser was tricked into sending: a foreign `Host` or `Origin`.

DNS rebinding: a page on `evil.example` makes its own name resolve to 127.0.0.1, and the
browser then lets it call this server and read the answers, as if same-origin (the class of
Ollama's CVE-2024-28224). The browser still sends `Host: evil.example`, which the page cannot
change. So a request is answered only when its Host (any port) is

- `localhost`, an IP address (a page cannot rebind a literal address, and front ends reach
  `--replica-url` servers by address), or the `--host` value;
- or one of `--allowed-hosts` (`.example.com`: it and its subdomains; `*`: any, for a server
  behind a proxy that checks Host itself).

Else 421 Misdirected Request: the request names a server this one is not (RFC 9110 15.5.20).

A page on another site may also send requests here without reading the answers (a form, a
`no-cors` fetch); the browser marks them with `Origin`. A request with an `Origin` is answered
only when the origin is this server's own (the request's Host) or one of `--allowed-origins`;
else 403. Requests without Host or Origin are not from a browser's page and pass. Both checks
cover every path (/health and /metrics too: a rebound page could read them), before anything
else reads the request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from headrace.api.errors import APIError, send_error

LOCAL_NAMES = frozenset({"localhost"})
# What a page on an allowed origin may read of an answer besides the simple headers.
EXPOSED = ("retry-after", "retry-after-ms", "x-ratelimit-limit-tokens",
           "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")  # fmt: skip
_ECHO = 100  # longest header value repeated in a refusal


@dataclass(frozen=True)
class HostPolicy:
    names: frozenset[str] = LOCAL_NAMES  # lowercase, no port, no trailing dot
    suffixes: tuple[str, ...] = ()  # ".example.com": the name and its subdomains
    any_host: bool = False
    origins: frozenset[str] = frozenset()  # "scheme://host[:port]", lowercase
    any_origin: bool = False

    @classmethod
    def build(
        cls, bind_host: str, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()
    ) -> HostPolicy:
        hosts = [_entry(h) for h in allowed_hosts if h.strip()]
        origins = [o.strip().lower().rstrip("/") for o in allowed_origins if o.strip()]
        names = {*LOCAL_NAMES, bind_host.lower().strip("[]").rstrip(".")}
        names |= {h for h in hosts if not h.startswith(".")}
        return cls(
            frozenset(names), tuple(h for h in hosts if h.startswith(".")), "*" in hosts,
            frozenset(origins), "*" in origins,
        )  # fmt: skip

    def allows_host(self, host: str | None) -> bool:
        if host is None or self.any_host:
            return True  # no Host at all: not a browser (every browser sends one)
        name = hostname(host)
        if name is None:
            return False
        if name in self.names or _is_address(name):
            return True
        return any(name.endswith(s) or name == s[1:] for s in self.suffixes)

    def allows_origin(self, origin: str | None, host: str | None) -> bool:
        if origin is None or self.any_origin:
            return True
        origin = origin.strip().lower()
        if origin in self.origins:
            return True
        _, sep, authority = origin.partition("://")
        return bool(sep) and host is not None and authority == host.strip().lower()


def hostname(host: str) -> str | None:
    """The name in a Host header, lowercase, without port or trailing dot ("[::1]" for IPv6);
    None when it is malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        name, rest = host[: end + 1], host[end + 1 :]
    else:
        name, sep, port = host.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name.rstrip(".") or None


def _entry(host: str) -> str:
    """An `--allowed-hosts` item as `allows_host` compares it (a port, if given, dropped)."""
    host = host.strip().lower()
    if host == "*" or host.startswith("."):
        return host
    return hostname(host) or host


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware in front of the app (`headrace.api.app.front_door`)."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await send_error(send, refusal)

    def _refusal(self, scope: Scope) -> APIError | None:
        host = origin = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        if not self.policy.allows_host(host):
            return APIError(
                421, f"Host {_echo(host)} is not served here: start the server with "
                "--allowed-hosts NAME to accept it", type="misdirected_request_error", code=421,
            )  # fmt: skip
        if not self.policy.allows_origin(origin, host):
            return APIError(
                403, f"Origin {_echo(origin)} may not call this server: start it with "
                "--allowed-origins ORIGIN to allow it", type="permission_error", code=403,
            )  # fmt: skip
        return None


def with_cors(app: ASGIApp, origins: Iterable[str]) -> ASGIApp:
    """`app` answering CORS preflights and adding `Access-Control-Allow-Origin` for `origins`
    (`--allowed-origins`); without any, `app` itself: no CORS header at all."""
    allowed = [o.strip().lower().rstrip("/") for o in origins if o.strip()]
    if not allowed:
        return app
    return CORSMiddleware(
        app, allow_origins=allowed, allow_methods=("GET", "POST"), allow_headers=("*",),
        expose_headers=EXPOSED, allow_private_network=True,
    )  # fmt: skip


def _echo(value: str | None) -> str:
    text = repr(value or "")
    return text if len(text) <= _ECHO else text[:_ECHO] + "..."
