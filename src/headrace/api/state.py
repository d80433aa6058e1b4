"""What every route shares: the engines by model name, the gateway, settings, metrics, and the
server's lifecycle (loading, ready, failed, shutting down)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from fastapi import Request

from headrace.api.errors import APIError
from headrace.api.grammar_cache import GrammarCache
from headrace.api.outcomes import Outcome
from headrace.api.response_store import ResponseStore
from headrace.api.structured import grammar_cache
from headrace.batches.service import Batches
from headrace.config import ServerConfig
from headrace.engine.frontend.client import EngineClient
from headrace.gateway.base import Gateway, Tenant
from headrace.gateway.reload import GatewayReloader
from headrace.ledger.writer import Ledger
from headrace.metrics.prometheus import Metrics


@dataclass
class AppState:
    engines: MutableMapping[str, EngineClient]  # filled in place when a background load ends
    gateway: Gateway
    config: ServerConfig
    metrics: Metrics
    loading: bool = False
    load_error: str | None = None
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    reloader: GatewayReloader | None = None  # SIGHUP and POST /admin/reload
    grammars: GrammarCache = field(default_factory=grammar_cache)  # compiled, by source
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter -> its base model
    lora_busy: set[str] = field(default_factory=set)  # adapters being loaded or unloaded
    ledger: Ledger | None = None  # usage and audit records (--no-ledger: None)
    responses: ResponseStore = field(default_factory=ResponseStore)  # previous_response_id
    batches: Batches | None = None  # the Batch API's files and jobs (--batch-dir off: None)

    def target(self, model: str | None, tenant: Tenant) -> Target:
        """What `model` names for `tenant`: a base model, or a LoRA adapter it may use (on its
        base model's engine). An adapter of another tenant does not exist for this one: the
        same 404, naming the same models, as for a name nobody serves."""
        base = self.adapters.get(model) if model is not None else None
        if model is None or base is None or not tenant.may_use(model):
            name, engine = self.engine_for(model, tenant)
            return Target(name, name, engine, None)
        _, engine = self.engine_for(base, tenant)
        return Target(model, base, engine, model)

    def visible_adapters(self, tenant: Tenant | None) -> dict[str, str]:
        """The adapters `tenant` may use (None: the operator, all of them) -> base model."""
        return {
            name: base
            for name, base in self.adapters.items()
            if tenant is None or tenant.may_use(name)
        }

    def engine_for(
        self, model: str | None, tenant: Tenant | None = None
    ) -> tuple[str, EngineClient]:
        """The engine serving `model`; no model means the first one."""
        self.check_accepting()
        model = model if model is not None else next(iter(self.engines))
        engine = self.engines.get(model)
        if engine is None:
            known = ", ".join([*self.engines, *(self.visible_adapters(tenant) if tenant else ())])
            raise APIError(
                404, f"model {model!r} does not exist; served: {known}",
                param="model", code="model_not_found",
            )  # fmt: skip
        if not engine.is_healthy:
            raise Outcome.ENGINE_DOWN.error(repr(model))
        return model, engine

    def check_accepting(self) -> None:
        if self.shutdown.is_set():
            raise Outcome.SHUTTING_DOWN.error()
        if self.load_error is not None:
            raise Outcome.LOAD_FAILED.error(self.load_error)
        if self.loading or not self.engines:
            raise Outcome.LOADING.error()

    def health(self, details: bool = True) -> tuple[int, dict[str, object]]:
        """Status code and body for /health; without `details`, the body is only its status
        (no error text, models, pids or replica URLs: those are for the operator)."""
        status, body = self._health()
        return status, (body if details else {"status": body["status"]})

    def _health(self) -> tuple[int, dict[str, object]]:
        if self.load_error is not None:
            return 503, {"status": "failed", "error": self.load_error}
        if self.shutdown.is_set():
            return 503, {"status": "shutting_down"}
        if self.loading or not self.engines:
            return 503, {"status": "loading"}
        models = {name: ("ok" if e.is_healthy else "dead") for name, e in self.engines.items()}
        ok = all(v == "ok" for v in models.values())
        body: dict[str, object] = {"status": "ok" if ok else "unhealthy", "models": models}
        replicas = {name: _replicas(e) for name, e in self.engines.items()}
        if any(replicas.values()):
            body["replicas"] = replicas
        return (200 if ok else 503), body


@dataclass(frozen=True)
class Target:
    """A request's model: the name it asked for, the base model, its engine, the adapter."""

    model: str
    base: str
    engine: EngineClient
    lora: str | None


def _replicas(engine: EngineClient) -> list[dict[str, object]]:
    """A router's replicas (name, state, pid or url, restarts, load); [] for a lone engine."""
    replicas = engine.describe().get("replicas", [])
    return replicas if isinstance(replicas, list) else []


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.headrace
    return state
