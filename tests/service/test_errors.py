"""service/gateway/errors.py in process: each error kind's three statuses, and the handlers that turn exceptions
into OpenAI's envelope (no server: a bare FastAPI app over ASGI)."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from service.gateway import errors

KINDS = [
    (errors.ServiceError, 500, "internal_error", grpc.StatusCode.INTERNAL),
    (errors.BadRequestError, 400, "invalid_request_error", grpc.StatusCode.INVALID_ARGUMENT),
    (errors.AuthenticationError, 401, "invalid_request_error", grpc.StatusCode.UNAUTHENTICATED),
    (errors.NotFoundError, 404, "invalid_request_error", grpc.StatusCode.NOT_FOUND),
    (errors.PayloadTooLargeError, 413, "invalid_request_error", grpc.StatusCode.INVALID_ARGUMENT),
    (errors.RateLimitError, 429, "rate_limit_error", grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.ServiceUnavailableError, 503, "service_unavailable", grpc.StatusCode.UNAVAILABLE),
    (errors.RequestAbortedError, 499, "aborted", grpc.StatusCode.CANCELLED),
    (errors.TimeoutError_, 504, "timeout", grpc.StatusCode.DEADLINE_EXCEEDED),
]


@pytest.mark.parametrize("kind, http, type_, grpc_status", KINDS, ids=[k[0].__name__ for k in KINDS])
def test_each_kind_carries_its_statuses(kind, http, type_, grpc_status):
    error = kind("boom", param="p", code="c")
    assert (error.http_status, error.type, error.grpc_status) == (http, type_, grpc_status)
    assert error.body() == {"error": {"message": "boom", "type": type_, "param": "p", "code": "c"}}
    assert error.status == "c" and kind("x").status == type_


def test_a_kind_must_name_all_three_statuses():
    with pytest.raises(TypeError):
        # the statuses it leaves out are the point: the class statement itself must fail
        class Incomplete(errors.ServiceError, http=418):  # pyright: ignore[reportCallIssue, reportGeneralTypeIssues]
            pass


class Body(BaseModel):
    n: int


def _app() -> FastAPI:
    app = FastAPI()
    errors.install_error_handlers(app)

    @app.post("/v1/x", responses=errors.responses(400, 429))
    async def x(body: Body):
        if body.n == 429:
            raise errors.RateLimitError("busy", retry_after_s=3)
        if body.n < 0:
            raise RuntimeError("bug")
        return {"n": body.n}

    return app


def _post(json: dict) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/x", json=json)

    return asyncio.run(go())


def test_handlers_answer_with_the_envelope_and_status():
    bad = _post({"n": "seven"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
    busy = _post({"n": 429})
    assert busy.status_code == 429 and busy.headers["retry-after"] == "3"
    assert busy.json()["error"] == {"message": "busy", "type": "rate_limit_error", "param": None, "code": None}
    crash = _post({"n": -1})
    assert crash.status_code == 500 and crash.json()["error"]["message"] == "internal error: RuntimeError"
    responses = _app().openapi()["paths"]["/v1/x"]["post"]["responses"]
    assert "422" not in responses and {"400", "429", "500"} <= set(responses)
