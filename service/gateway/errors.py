"""Every error the gateway returns, mapped in one place: OpenAI's envelope for HTTP, a status code for gRPC.

`{"error": {"message", "type", "param", "code"}}` with the status codes OpenAI and vLLM use: 400 bad input (wrong
types included, as both do, rather than FastAPI's 422), 401 bad API key, 404 unknown model or route, 413 body too
large, 429 every worker saturated (with Retry-After), 503 no worker ready or shutting down, 504 request timeout.
"""

from __future__ import annotations

import logging

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    http_status = 500
    type = "internal_error"
    grpc_status = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None):  # fmt: skip
        super().__init__(message)
        self.message, self.param, self.code, self.retry_after_s = message, param, code, retry_after_s

    @property
    def status(self) -> str:
        """The `status` label of deepspec:request_success_total."""
        return self.code or self.type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequestError(ServiceError):
    http_status, type, grpc_status = 400, "invalid_request_error", grpc.StatusCode.INVALID_ARGUMENT


class AuthenticationError(ServiceError):
    http_status, type, grpc_status = 401, "invalid_request_error", grpc.StatusCode.UNAUTHENTICATED


class NotFoundError(ServiceError):
    http_status, type, grpc_status = 404, "invalid_request_error", grpc.StatusCode.NOT_FOUND


class PayloadTooLargeError(ServiceError):
    http_status, type, grpc_status = 413, "invalid_request_error", grpc.StatusCode.INVALID_ARGUMENT


class RateLimitError(ServiceError):
    http_status, type, grpc_status = 429, "rate_limit_error", grpc.StatusCode.RESOURCE_EXHAUSTED


class ServiceUnavailableError(ServiceError):
    http_status, type, grpc_status = 503, "service_unavailable", grpc.StatusCode.UNAVAILABLE


class RequestAbortedError(ServiceError):
    """Ended by an explicit Abort call (the client closing its own stream needs no answer)."""

    http_status, type, grpc_status = 499, "aborted", grpc.StatusCode.CANCELLED


class TimeoutError_(ServiceError):
    http_status, type, grpc_status = 504, "timeout", grpc.StatusCode.DEADLINE_EXCEEDED


def error_response(error: ServiceError) -> JSONResponse:
    headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else None
    return JSONResponse(error.body(), status_code=error.http_status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    parts = [f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}" for e in errors[:5]]
    return "; ".join(parts), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
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
