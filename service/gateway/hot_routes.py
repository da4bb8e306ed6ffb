"""The generation routes (POST /v1/completions, /v1/chat/completions) answered without FastAPI's per-request
machinery; their declarations in routers/, and so the OpenAPI document, stay as they are.

For every request FastAPI matches the route, opens two exit stacks, parses the body with `json`, validates it and
resolves the endpoint's dependencies through its general solver: against a fast upstream, about a third of what the
gateway spends on a whole completion (bench/openai_upstream.py). `HotRoutes` does the same work directly for the
routes it is given: pydantic parses and validates the body in one step (`model_validate_json`), each dependency (a
coroutine function of the request alone) is awaited, the endpoint's Response is sent, and an exception the app has
a handler for (errors.py) is answered by that handler, as Starlette's ExceptionMiddleware would; any other goes up
to the server-error middleware, as before.

Whatever the fast path would answer differently goes the usual way, through FastAPI: a body pydantic's JSON parser
refuses or that does not validate (so every refusal keeps FastAPI's and errors.py's message; the JSON parser also
refuses what `json` reads, a byte-order mark or a lone surrogate escape, and FastAPI then reads it as before), and
every other route.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.responses import Response
from starlette.routing import BaseRoute


@dataclass(frozen=True)
class HotEndpoint:
    """One route's endpoint with what calling it takes: its body model and its dependencies."""

    route: APIRoute
    body_model: type[BaseModel]

    @classmethod
    def of(cls, route: APIRoute) -> HotEndpoint:
        """The endpoint of `route`; ValueError when it takes more than a JSON body, the request and dependencies
        that are coroutine functions of the request alone (what `call` knows how to pass)."""
        dependant = route.dependant
        plain = [dependant, *dependant.dependencies]
        body_model = dependant.body_params[0].field_info.annotation if len(dependant.body_params) == 1 else None
        if (
            not (isinstance(body_model, type) and issubclass(body_model, BaseModel))
            or not asyncio.iscoroutinefunction(dependant.call)
            or any(d.path_params or d.query_params or d.header_params or d.cookie_params for d in plain)
            or any(
                d.body_params or d.dependencies or not asyncio.iscoroutinefunction(d.call)
                for d in dependant.dependencies
            )
        ):
            raise ValueError(
                f"{route.path} takes more than a JSON body (a pydantic model), the request and async dependencies "
                "of the request: leave it to FastAPI"
            )
        return cls(route, body_model)

    async def call(self, app: FastAPI, body: BaseModel, request: Request) -> Response:
        dependant = self.route.dependant
        assert dependant.call is not None  # `of` checked it is a coroutine function
        arguments: dict[str, object] = {dependant.body_params[0].name: body}
        if dependant.request_param_name:
            arguments[dependant.request_param_name] = request
        for dependency in dependant.dependencies:
            # `of` checked each is a coroutine function; FastAPI names every dependency it solves
            assert dependency.call is not None and dependency.name is not None
            call = app.dependency_overrides.get(dependency.call, dependency.call)
            arguments[dependency.name] = await call(
                **{dependency.request_param_name: request} if dependency.request_param_name else {}
            )
        response = await dependant.call(**arguments)
        assert isinstance(response, Response), f"{self.route.path} must answer a Response, not {type(response)}"
        return response


class HotRoutes:
    """Pure ASGI: serves POST on `routes`' paths as the module docstring says, and hands everything else to `app`."""

    def __init__(self, app, fastapi_app: FastAPI, routes: Sequence[BaseRoute]):
        self.app, self.fastapi_app = app, fastapi_app
        self.endpoints = {
            route.path: HotEndpoint.of(route) for route in _api_routes(routes) if "POST" in (route.methods or ())
        }

    async def __call__(self, scope, receive, send):
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            return await self.app(scope, receive, send)
        messages, more = [], True
        while more:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":  # a disconnect before the whole body: FastAPI's to answer
                return await self.app(scope, _replay(messages, receive), send)
            more = message.get("more_body", False)
        try:
            body = endpoint.body_model.model_validate_json(b"".join(m.get("body", b"") for m in messages))
        except ValueError:  # pydantic's ValidationError among them
            return await self.app(scope, _replay(messages, receive), send)
        request = Request(scope, receive, send)
        try:
            response = await endpoint.call(self.fastapi_app, body, request)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):  # every handler of errors.py is a coroutine function
                response = await response
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception):
        """The app's handler for `exc`, as Starlette's ExceptionMiddleware picks it (the nearest class in its MRO);
        None for one only the server-error middleware handles (`Exception`)."""
        handlers = self.fastapi_app.exception_handlers
        return next((handlers[cls] for cls in type(exc).__mro__ if cls in handlers and cls is not Exception), None)


def _api_routes(routes: Sequence[BaseRoute]) -> list[APIRoute]:
    """`routes`, each a FastAPI route (a router's `routes` are typed as Starlette's); TypeError for another kind."""
    api_routes = []
    for route in routes:
        if not isinstance(route, APIRoute):
            raise TypeError(f"the fast path serves FastAPI routes only, not {type(route).__name__} {route}")
        api_routes.append(route)
    return api_routes


def _replay(messages: list[dict], receive):
    """A `receive` that gives `messages` again, then what `receive` gives."""
    pending = list(messages)

    async def replay():
        return pending.pop(0) if pending else await receive()

    return replay
