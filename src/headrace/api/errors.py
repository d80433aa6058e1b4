"""Every error leaves the server in OpenAI's shape: `{"error": {message, type, param, code}}`.

Route code raises `APIError`; the handlers installed by `install_error_handlers` turn it, the
gateway's refusals, FastAPI's validation errors (400 like OpenAI, not 422) and stray HTTP
exceptions into that JSON body.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Send

from headrace.api.text import printable
from headrace.gateway.errors import GatewayError

log = logging.getLogger("headrace.api")

DEFAULT_RETRY_AFTER_S = 1

_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """A refusal with an HTTP status, raised anywhere below a route."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES_BY_STATUS.get(status, "server_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        if status == 503 and not any(k.lower() == "retry-after" for k in self.headers):
            # Every 503 says when to come back; refusals that know better set their own.
            self.headers["Retry-After"] = str(DEFAULT_RETRY_AFTER_S)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    @classmethod
    def from_gateway(cls, err: GatewayError) -> APIError:
        return cls(
            err.status, err.message, type=err.error_type, code=err.status, headers=err.headers
        )


async def send_error(send: Send, error: APIError) -> None:
    """Answer with `error` straight from ASGI middleware, before the app reads the request.
    The body is left unread: the connection closes, so that it is not parsed as a request."""
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
               for k, v in error.headers.items()]  # fmt: skip
    headers += [(b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_body(
    message: str, type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    # Messages and params may echo client text (a bad JSON key): keep them encodable.
    message = printable(message)
    param = None if param is None else printable(param)
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return APIError.from_gateway(exc).response()


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = describe_validation_errors(exc.errors())
    return bad_request(message, param).response()


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    err = APIError(exc.status_code, str(exc.detail), code=exc.status_code, headers=exc.headers)
    return err.response()


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return APIError(500, "internal server error", type="server_error").response()


def describe_validation_errors(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One readable sentence for pydantic's error list, and the first offending field.

    A union field (`prompt`: text, token ids, or a list of text) fails once per member; when a
    value check failed (the value had the right type but not a valid value), only those
    errors are told, since a type mismatch with the other members says nothing useful.
    """
    if any(e.get("type") == "json_invalid" for e in errors):
        bad = next(e for e in errors if e.get("type") == "json_invalid")
        return "request body is not valid JSON: " + str(bad.get("msg", "")), None
    values = [e for e in errors if e.get("type") == "value_error"]
    parts: list[str] = []
    param: str | None = None
    for err in values or errors:
        field = ".".join(_field_path(err.get("loc", ())))
        if param is None and field:
            param = field
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        part = f"{field or 'body'}: {msg}"
        if part not in parts:
            parts.append(part)
    return "; ".join(parts) or "invalid request", param


def _field_path(loc: Sequence[Any]) -> list[str]:
    """pydantic's location without `body` and the union-member tags it inserts
    (`str`, `list[int]`, `function-after[...]`)."""
    return [
        str(x) for x in loc
        if x != "body" and not (isinstance(x, str) and ("[" in x or x in _TYPE_TAGS))
    ]  # fmt: skip


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
