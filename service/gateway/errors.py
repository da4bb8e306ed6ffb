"""Every error the gateway returns, mapped in one place: OpenAI's envelope for HTTP, a status code for gRPC.

`{"error": {"message", "type", "param", "code"}}` with the status codes OpenAI and vLLM use: 400 bad input (wrong
types included, as both do, rather than FastAPI's 422), 401 bad API key, 404 unknown model or route, 413 body too
large, 429 every worker saturated (with Retry-After), 503 no worker ready or shutting down, 504 request timeout;
499 without a body when the client hung up before the answer (`ClientDisconnected`).
The OpenAPI document says the same: routes list their errors with `responses(...)` and `install_error_handlers`
drops the 422 FastAPI documents on every route with a body.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

#: pydantic names union members in an error's loc by their type; those are not field names
_TYPE_TAG = re.compile(r"[\[\-]|^(str|int|float|bool|list|dict)$")


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was ready; its worker call has been cancelled. Answered 499
    (nginx's "client closed request") with no body: nobody is left to read one, the status is for logs and metrics."""


class ServiceError(Exception):
    """An error with its HTTP status, OpenAI error type and gRPC status. A subclass names all three in its class
    line (`class X(ServiceError, http=..., kind=..., grpc_status=...)`), so each kind is declared once."""

    http_status = 500
    type = "internal_error"
    grpc_status = grpc.StatusCode.INTERNAL
    #: why the gateway shed the request (admission.py DROP_REASONS), sent as DROP_REASON_HEADER; None = not shed
    drop_reason: str | None = None

    def __init_subclass__(cls, *, http: int, kind: str, grpc_status: grpc.StatusCode, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.http_status, cls.type, cls.grpc_status = http, kind, grpc_status

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, retry_after_s: int | None = None
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.retry_after_s = message, param, code, retry_after_s

    @property
    def status(self) -> str:
        """The `status` label of deepspec:request_success_total."""
        return self.code or self.type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_INVALID, _CODE = "invalid_request_error", grpc.StatusCode
#: the response header naming why a request was shed (429 from the admission queue)
DROP_REASON_HEADER = "x-deepspec-drop-reason"


class BadRequestError(ServiceError, http=400, kind=_INVALID, grpc_status=_CODE.INVALID_ARGUMENT):
    """Bad input: wrong type, out of range, unsupported field, too long for the context."""


class AuthenticationError(ServiceError, http=401, kind=_INVALID, grpc_status=_CODE.UNAUTHENTICATED):
    """A missing or wrong API key."""


class NotFoundError(ServiceError, http=404, kind=_INVALID, grpc_status=_CODE.NOT_FOUND):
    """An unknown model or route."""


class PayloadTooLargeError(ServiceError, http=413, kind=_INVALID, grpc_status=_CODE.INVALID_ARGUMENT):
    """A request body over the gateway's limit."""


class RateLimitError(ServiceError, http=429, kind="rate_limit_error", grpc_status=_CODE.RESOURCE_EXHAUSTED):
    """Every worker is saturated; carries Retry-After."""


class ServiceUnavailableError(ServiceError, http=503, kind="service_unavailable", grpc_status=_CODE.UNAVAILABLE):
    """No worker is ready, or the gateway is shutting down."""


class RequestAbortedError(ServiceError, http=499, kind="aborted", grpc_status=_CODE.CANCELLED):
    """Ended by an explicit Abort call (the client closing its own stream needs no answer)."""


class TimeoutError_(ServiceError, http=504, kind="timeout", grpc_status=_CODE.DEADLINE_EXCEEDED):
    """The request ran past its timeout."""


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error envelope, the body of every error response."""

    error: ErrorDetail


_MEANING = {
    400: "bad input: wrong type, out of range, unsupported field, or too long for the model's context",
    401: "missing or wrong API key",
    404: "unknown model",
    413: "the request body is too large",
    429: "every worker is saturated, the request was shed by the gateway's admission queue (the "
    "x-deepspec-drop-reason header says why) or its key's token budget is spent: retry after Retry-After seconds",
    500: "internal error",
    503: "no worker is ready, or the gateway is shutting down (Retry-After)",
    504: "the request timed out",
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that can answer these error statuses (500 always)."""
    return {status: {"model": ErrorBody, "description": _MEANING[status]} for status in sorted({*statuses, 500})}


def error_response(error: ServiceError) -> JSONResponse:
    headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else {}
    if error.drop_reason:
        headers[DROP_REASON_HEADER] = error.drop_reason
    return JSONResponse(error.body(), status_code=error.http_status, headers=headers or None)


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic errors, HTTP's or gRPC's: the first five as `field: reason`, the first field as
    the param."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    param = _field(first)
    return "; ".join(f"{_field(e) or 'body'}: {_reason(e)}" for e in errors[:5]), param


def _reason(error: Mapping[str, Any]) -> str:
    if error.get("type") == "extra_forbidden":
        return "unrecognized request argument: DeepSpec does not implement this field (remove it)"
    if error.get("type") == "too_long" and _field(error) == "tools":
        return "tool calls are not supported (send no tools)"
    return str(error.get("msg"))


def _field(error: Mapping[str, Any]) -> str | None:
    """`messages.0.content` from a pydantic loc, without the union members' type tags (`function-after[...]`, `str`)."""
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    return ".".join(part for part in loc if not _TYPE_TAG.search(part)) or None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error with OpenAI's envelope, and say so in /openapi.json (400 where FastAPI would write 422)."""
    generate_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate_openapi()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError):
        return error_response(exc)

    @app.exception_handler(ClientDisconnected)
    async def client_disconnected(request: Request, exc: ClientDisconnected):
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return error_response(BadRequestError(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = {401: AuthenticationError, 404: NotFoundError, 413: PayloadTooLargeError}.get(exc.status_code)
        if kind is None:
            error = ServiceError(str(exc.detail)) if exc.status_code >= 500 else BadRequestError(str(exc.detail))
            error.http_status = exc.status_code
        else:
            error = kind(str(exc.detail))
        if exc.status_code == 404 and exc.detail == "Not Found":
            error.message = f"no route {request.method} {request.url.path}"
        return error_response(error)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        return error_response(ServiceError(f"internal error: {type(exc).__name__}"))
