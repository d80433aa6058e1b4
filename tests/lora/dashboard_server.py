"""A real server for the LoRA panel's tests: the tiny Llama with two random adapters behind
a tenants file (the dashboard then wants the admin key), `--max-loras 1 --max-cpu-loras 1` so
that serving one adapter after the other reads and evicts weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
from factories import Server, make_tiny, serve_args, serving, write_tenants
from factories.lora import make_adapter

from headrace.gateway.auth import hash_key

ADAPTERS = ("support", "legal")
ADMIN = {"authorization": "Bearer admin"}
BOB = {"authorization": "Bearer bob"}
TENANTS = f"""
admin_key_sha256: [{hash_key("admin")}]
tenants:
  bob: {{adapters: "*", api_key_sha256: [{hash_key("bob")}]}}
"""


def lora_server(tmp: Path) -> Iterator[Server]:
    """A fixture's body: build the model and the adapters in `tmp`, serve them, stop."""
    make_tiny("llama", tmp / "tiny")
    for seed, name in enumerate(ADAPTERS, start=1):
        make_adapter(tmp / "tiny", tmp / name, seed)
    args = serve_args(f"tiny={tmp / 'tiny'}", extra=("--num-threads", "1"))
    args += ["--tenants", str(write_tenants(tmp, TENANTS)), "--ledger", str(tmp / "ledger.db")]
    args += ["--max-loras", "1", "--max-cpu-loras", "1"]
    for name in ADAPTERS:
        args += ["--lora", f"{name}={tmp / name}"]
    yield from serving(args, tmp)


def send_each(url: str) -> dict[str, tuple[int, int]]:
    """One completion per model (the base, then each adapter) as tenant bob; the usage each
    client was told, as {model: (prompt tokens, completion tokens)}."""
    told: dict[str, tuple[int, int]] = {}
    for i, model in enumerate(("tiny", *ADAPTERS)):
        body = {"model": model, "prompt": "hello there " * (i + 1), "max_tokens": 3 + i,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        r = httpx.post(url + "/v1/completions", json=body, headers=BOB, timeout=60)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        told[model] = (usage["prompt_tokens"], usage["completion_tokens"])
    return told
