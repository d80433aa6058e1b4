"""The HTTP server, the gateway in front of it, the ledger and the Batch API."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.config.fields import items, setting


@dataclass(frozen=True)
class ServerConfig:
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8000, "port to bind")
    request_timeout_s: float = setting(600.0, "default per-request timeout, seconds")
    max_body_bytes: int = setting(1_000_000, "largest request body accepted")
    max_header_bytes: int = setting(16_384, "largest request line + headers accepted; more get 431")
    header_timeout_s: float = setting(
        30.0, "a request's line and headers must arrive within this, s"
    )
    body_timeout_s: float = setting(
        60.0, "a request's body must arrive within this after its head, s"
    )
    max_connections: int = setting(
        1000, "most open client connections; more get 503 with Retry-After"
    )
    send_timeout_s: float = setting(
        30.0, "a client that reads none of a response for this long is dropped, s"
    )
    http_parser: str = setting("httptools", "httptools (C) | h11 (pure Python): parses requests")
    log_level: str = setting("info", "debug | info | warning | error")
    otlp_traces_endpoint: str | None = setting(
        None, "OTLP/HTTP collector for request traces, e.g. http://127.0.0.1:4318/v1/traces"
    )
    allowed_hosts: str | None = setting(
        None, "Host header names answered besides localhost, IP addresses and --host, "
        "comma-separated (.example.com: it and its subdomains; *: any, behind a proxy); "
        "others get 421 (DNS rebinding)",
    )  # fmt: skip
    allowed_origins: str | None = setting(
        None, "browser origins (scheme://host[:port]) that may call this server, "
        "comma-separated, answered with CORS headers (*: any); other cross-origin requests "
        "get 403. Default: none",
    )  # fmt: skip
    api_docs: bool = setting(
        False, "serve the OpenAPI schema at /openapi.json (behind the admin key on a guarded "
        "server); off by default",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for origin in self.origin_list:
            if origin == "null":  # sandboxed frames and file: pages of any site send it
                raise ValueError("allowed_origins: 'null' would let any page's sandboxed frame in")
            if origin != "*" and "://" not in origin:
                raise ValueError(f"allowed_origins: {origin!r} is not scheme://host[:port]")
        for host in self.host_list:
            if "/" in host or " " in host:
                raise ValueError(f"allowed_hosts: {host!r} is not a host name")
        if min(self.max_body_bytes, self.max_header_bytes, self.max_connections) < 1:
            raise ValueError("body and header sizes and max_connections must be positive")
        if min(self.header_timeout_s, self.body_timeout_s, self.send_timeout_s) <= 0:
            raise ValueError("header_timeout_s, body_timeout_s and send_timeout_s must be positive")
        if self.http_parser not in ("httptools", "h11"):
            raise ValueError(f"unknown http_parser {self.http_parser!r}: httptools or h11")
        endpoint = self.otlp_traces_endpoint
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"otlp_traces_endpoint must be an http(s) URL, got {endpoint!r}")

    @property
    def host_list(self) -> list[str]:
        return items(self.allowed_hosts)

    @property
    def origin_list(self) -> list[str]:
        return items(self.allowed_origins)


@dataclass(frozen=True)
class GatewayConfig:
    tenants: str | None = setting(None, "tenants file (.yaml or .toml): API keys, tiers, limits")
    max_queued_requests: int | None = setting(
        None, "most requests waiting at a priority and above; then 503 for a tenant at its share"
    )
    max_queued_tokens: int | None = setting(
        None, "most tokens (prompt + max_tokens) waiting; then 503 for a tenant at its share"
    )
    admin_key: str | None = setting(
        None, "key that /metrics, /v1/stats, /v1/replica/* and /admin/* require (or "
        "admin_key_sha256); visible in the process list: prefer --admin-key-file or "
        "HEADRACE_ADMIN_KEY",
    )  # fmt: skip
    admin_key_file: str | None = setting(
        None, "file holding the admin key (read again on reload); instead of --admin-key"
    )
    replica_api: bool = setting(
        False, "without --tenants or an admin key: serve /v1/replica/* (to anyone) anyway"
    )
    queue_timeout_s: float = setting(
        60.0, "queue deadline (s from HTTP arrival) where the tenant or tier sets none; then 503"
    )

    def __post_init__(self) -> None:
        for name in ("max_queued_requests", "max_queued_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive")
        if not self.queue_timeout_s > 0:
            raise ValueError("queue_timeout_s must be positive")


@dataclass(frozen=True)
class LedgerConfig:
    ledger: str | None = setting(
        None, "usage and audit ledger: an SQLite file (default: ledger.db in the state "
        "directory, $HEADRACE_STATE) or a postgresql:// URL; off, or --no-ledger: none "
        "(docs/ledger.md)",
    )  # fmt: skip
    ledger_flush_s: float = setting(
        1.0, "the ledger's records are written in batches this often, s"
    )
    ledger_max_pending: int = setting(
        100_000,
        "records held in memory while the ledger cannot be written; more go to its spill file",
    )

    def __post_init__(self) -> None:
        if self.ledger_flush_s <= 0 or self.ledger_max_pending < 1:
            raise ValueError("ledger_flush_s and ledger_max_pending must be positive")

    @property
    def enabled(self) -> bool:
        return self.ledger != "off"


@dataclass(frozen=True)
class BatchConfig:
    batch_dir: str | None = setting(
        None, "where /v1/files and /v1/batches keep their files and jobs (default: batches/ in "
        "the state directory, $HEADRACE_STATE); off: no Batch API (docs/batches.md)",
    )  # fmt: skip
    batch_max_file_bytes: int = setting(
        100_000_000, "largest file accepted by POST /v1/files, bytes"
    )
    batch_max_lines: int = setting(50_000, "most requests in one batch input file")
    batch_concurrency: int = setting(4, "batch lines in flight at once, over all batches")

    def __post_init__(self) -> None:
        if min(self.batch_max_file_bytes, self.batch_max_lines, self.batch_concurrency) < 1:
            raise ValueError("the batch file size, line count and concurrency must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.batch_dir != "off"
