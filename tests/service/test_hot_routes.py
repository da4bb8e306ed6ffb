"""The generation routes' fast path (service/gateway/hot_routes.py) answers exactly as FastAPI would, and does serve.

A toy app in memory: one route with a JSON body of the gateway's own CompletionRequest, the request and a dependency
of the request, the gateway's error handlers. The same bodies go to it with and without `HotRoutes` in front;
`Request.body` is counted to show which path answered: FastAPI reads the body through it, the fast path never does.
"""

from __future__ import annotations

from typing import Annotated

import pytest
import starlette.requests
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from service.gateway.dependencies import json_response
from service.gateway.errors import BadRequestError, install_error_handlers
from service.gateway.hot_routes import HotEndpoint, HotRoutes
from service.gateway.schemas import CompletionRequest


async def get_caller(request: Request) -> str:
    return request.headers.get("x-caller", "anonymous")


router = APIRouter()


@router.post("/v1/completions")
async def complete(body: CompletionRequest, request: Request, caller: Annotated[str, Depends(get_caller)]):
    if body.prompt == "refuse":
        raise BadRequestError("refused by the endpoint", param="prompt")
    if body.prompt == "crash":
        raise RuntimeError("a bug")
    return json_response({"body": body.model_dump(mode="json"), "caller": caller, "path": request.url.path})


def make_app(hot: bool) -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    install_error_handlers(app)
    if hot:
        app.add_middleware(HotRoutes, fastapi_app=app, routes=router.routes)
    return app


@pytest.fixture
def fastapi_reads(monkeypatch):
    """One entry per time FastAPI read a body (a request it answered reads it at least once)."""
    calls = []
    body = starlette.requests.Request.body

    async def counted(self):
        calls.append(1)
        return await body(self)

    monkeypatch.setattr(starlette.requests.Request, "body", counted)
    return calls


#: valid bodies, some at the edges where pydantic's JSON mode and `json` + python mode could part
ACCEPTED = [
    b'{"prompt": "x"}',
    b'{"prompt": "x", "prompt": "y"}',
    b'{"prompt": "x", "max_tokens": 3.0}',
    b'{"prompt": [1, 2.0], "seed": 18446744073709551615, "temperature": 1}',
    b' {"prompt": "x"}\n',
    b'{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": '
    b'{"type": "number", "maximum": 1e400}}}}',
]
#: bodies that FastAPI reads but pydantic's JSON parser does not: the fast path hands them over
FASTAPI_READS = [b'\xef\xbb\xbf{"prompt": "x"}', b'{"prompt": "a\\ud800b"}']
REFUSED = [
    b'{"prompt": ',
    b"",
    b'{"prompt": "x", "max_tokens": "5"}',
    b'{"prompt": "x", "bogus": 1}',
    b'{"prompt": "x", "seed": 18446744073709551616}',
    b'{"prompt": "x", "presence_penalty": NaN}',
    b"[1]",
]


def answers(hot: bool, body: bytes, headers: dict | None = None):
    with TestClient(make_app(hot), raise_server_exceptions=False) as client:
        response = client.post(
            "/v1/completions", content=body, headers={"content-type": "application/json", **(headers or {})}
        )
        return response.status_code, response.headers["content-type"], response.content


@pytest.mark.parametrize("body", ACCEPTED + FASTAPI_READS + REFUSED)
def test_the_fast_path_answers_as_fastapi(body):
    assert answers(True, body) == answers(False, body)


@pytest.mark.parametrize("body", ACCEPTED)
def test_valid_bodies_skip_fastapi(body, fastapi_reads):
    status, _, content = answers(True, body, {"x-caller": "k1"})
    assert status == 200 and b'"caller":"k1"' in content and b'"path":"/v1/completions"' in content
    assert fastapi_reads == []


@pytest.mark.parametrize("body", FASTAPI_READS + REFUSED)
def test_other_bodies_go_to_fastapi(body, fastapi_reads):
    answers(True, body)
    assert fastapi_reads


def test_an_endpoints_error_is_answered_by_its_handler(fastapi_reads):
    status, _, content = answers(True, b'{"prompt": "refuse"}')
    assert (status, fastapi_reads) == (400, []) and b"refused by the endpoint" in content
    assert answers(True, b'{"prompt": "refuse"}') == answers(False, b'{"prompt": "refuse"}')


def test_an_unhandled_error_reaches_the_server_error_middleware():
    status, _, content = answers(True, b'{"prompt": "crash"}')
    assert status == 500 and b"internal error: RuntimeError" in content
    assert answers(True, b'{"prompt": "crash"}') == answers(False, b'{"prompt": "crash"}')


def test_a_route_with_more_than_a_body_and_request_dependencies_is_refused():
    other = APIRouter()

    @other.post("/v1/with-query")
    async def with_query(body: CompletionRequest, limit: int = 3):
        return None

    route = other.routes[0]
    assert isinstance(route, APIRoute)
    with pytest.raises(ValueError, match="leave it to FastAPI"):
        HotEndpoint.of(route)


def test_the_gateway_app_answers_through_its_front():
    """`create_app`'s front (app.GatewayApp): the guard refuses a keyless request on every /v1 route, a bug in a
    generation route is a 500 in OpenAI's envelope, a body the fast path refuses still gets FastAPI's 400, and the
    other routes are FastAPI's."""
    from service.gateway.app import GatewayState, create_app
    from service.gateway.settings import GatewaySettings

    state = GatewayState.build(GatewaySettings(workers="127.0.0.1:1", grpc_port=-1, api_keys="sekret"))
    app = create_app(state=state)
    app.state.gateway = state

    def crash(requested):
        raise RuntimeError("a bug")

    state.dispatcher.resolve_model = crash
    key = {"authorization": "Bearer sekret"}
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 401
        assert client.get("/v1/models").status_code == 401
        crashed = client.post("/v1/completions", json={"prompt": "x"}, headers=key)
        assert crashed.status_code == 500
        assert crashed.json()["error"]["message"] == "internal error: RuntimeError"
        refused = client.post("/v1/completions", json={"prompt": "x", "n": "seven"}, headers=key)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
        assert client.get("/v1/models", headers=key).status_code == 200
        assert client.get("/openapi.json").status_code == 200
