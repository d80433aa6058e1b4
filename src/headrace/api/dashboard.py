"""`GET /dashboard`: a live page of the server's state, served from the package, offline.

- `/dashboard`: the page (HTML); `/dashboard/static/NAME`: its script, style and the vendored
  uPlot (every file shipped in `headrace/api/static/`, no CDN).
- `/dashboard/data`: the JSON snapshot the page polls once a second (`dashboard_data`);
  `?ttft_ms=&tpot_ms=` set the SLO targets its goodput is judged against (finite, positive,
  at most an hour and a minute; else 400).
- `/dashboard/ledger`: the usage ledger's tenants per hour over the last day, which the page
  polls every 30 s (`dashboard_data.ledger_hours`).

Who may look is the rule of `/v1/stats` (`InternalAccess`, scope STATS): on a guarded server,
the admin key. A browser cannot add a bearer header to a page it navigates to, so the key is
also taken as the password of HTTP Basic authentication: a 401 here asks for it
(`WWW-Authenticate: Basic`), and the browser then sends it with every request of the page.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from functools import cache
from importlib import resources

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from headrace.api.dashboard_data import ledger_hours, snapshot
from headrace.api.state import app_state
from headrace.gateway.access import Scope
from headrace.gateway.errors import GatewayError
from headrace.metrics.window import SloTargets

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}
STATIC = (
    "dashboard.html", "dashboard.js", "dashboard_lora.js", "dashboard.css",
    "uPlot.iife.min.js", "uPlot.min.css",
)  # fmt: skip
MAX_TTFT_MS = 3_600_000.0  # an hour
MAX_TPOT_MS = 60_000.0  # a minute per token
REALM = 'Basic realm="headrace dashboard", charset="UTF-8"'

router = APIRouter(include_in_schema=False)


@router.get("/dashboard")
async def page(request: Request) -> Response:
    return _guarded(request) or _file("dashboard.html", cache_s=0)


@router.get("/dashboard/static/{name}")
async def static(request: Request, name: str) -> Response:
    if name not in STATIC:
        return JSONResponse({"error": {"message": "no such file"}}, status_code=404)
    return _guarded(request) or _file(name, cache_s=3600)


@router.get("/dashboard/data")
async def data(
    request: Request,
    # Finite and sane: `inf` or 1e309 passed `gt=0` and could not be written as JSON (500).
    ttft_ms: float = Query(1000.0, gt=0, le=MAX_TTFT_MS, allow_inf_nan=False),
    tpot_ms: float = Query(100.0, gt=0, le=MAX_TPOT_MS, allow_inf_nan=False),
) -> Response:
    refusal = _guarded(request)
    if refusal is not None:
        return refusal
    slo = SloTargets(ttft_s=ttft_ms / 1000, tpot_s=tpot_ms / 1000)
    body = snapshot(app_state(request), slo)
    return JSONResponse(body, headers={"cache-control": "no-store"})


@router.get("/dashboard/ledger")
async def ledger(request: Request) -> Response:
    refusal = _guarded(request)
    if refusal is not None:
        return refusal
    body = await run_in_threadpool(ledger_hours, app_state(request))
    return JSONResponse(body, headers={"cache-control": "no-store"})


def _guarded(request: Request) -> Response | None:
    """None when the caller may look; else a 401 that makes a browser ask for the key."""
    try:
        app_state(request).gateway.access.authorize(Scope.STATS, with_basic_key(request.headers))
    except GatewayError as e:
        body = {"error": {"message": e.message, "type": "authentication_error", "code": 401}}
        return JSONResponse(body, status_code=401, headers={"www-authenticate": REALM})
    return None


def with_basic_key(headers: Mapping[str, str]) -> Mapping[str, str]:
    """`headers`, with the password of `Authorization: Basic` as a bearer key (any user)."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return headers
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return {}
    return {"authorization": f"Bearer {decoded.partition(':')[2]}"}


@cache
def _read(name: str) -> bytes:
    return resources.files("headrace.api").joinpath("static", name).read_bytes()


def _file(name: str, cache_s: int) -> Response:
    kind = TYPES[name[name.rfind(".") :]]
    control = f"max-age={cache_s}" if cache_s else "no-cache"
    return Response(_read(name), media_type=kind, headers={"cache-control": control})
