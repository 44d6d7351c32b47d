"""The counter example behind ASGI layers of one kind, by LAYERS_KIND, with a route that tells
whether a stream's body would go to uvicorn's own `send` (web/server_send.py). Served in process
by tests/web/test_server_send.py, with COUNTER_DB set.

- `known`: sessions, CORS and trusted hosts besides the example's SecurityHeaders;
- `recorder`: a pure ASGI middleware that keeps every body chunk of every response it passes on;
- `http`: an `@app.middleware("http")` (Starlette's BaseHTTPMiddleware);
- `mounted`: the example mounted under `/app` of another FastAPI app;
- `telemetry`: the example's router and command in an app with FastAPI's own telemetry on.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from opentelemetry.sdk.trace import TracerProvider
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastapi_lith.web.server_send import server_send
from tests.support.inprocess import load_module

KIND = os.environ["LAYERS_KIND"]
example = load_module("examples.counter.app")  # a copy of its own, with this server's environment
counter: FastAPI = example.app
# Every body chunk the recorder passed on, by request path: what the client must have received.
RECORDED: dict[str, bytearray] = {}


class Recorder:
    """Keeps each body chunk it hands on: a layer that reads bodies, so it must see them all."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kept = RECORDED.setdefault(scope["path"], bytearray())

        async def keep(message: Message) -> None:
            if message["type"] == "http.response.body":
                kept.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, keep)


async def direct(request: Request) -> dict[str, bool]:
    """Whether a stream answered here would write its body to uvicorn itself."""
    return {"direct": server_send(request.scope, request.receive) is not None}


counter.add_api_route("/direct", direct)


app: ASGIApp = counter
if KIND == "known":
    counter.add_middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1"])
    counter.add_middleware(CORSMiddleware, allow_origins=["http://127.0.0.1"])
    counter.add_middleware(SessionMiddleware, secret_key="layers")
elif KIND == "recorder":
    counter.add_middleware(Recorder)
elif KIND == "http":

    @counter.middleware("http")
    async def passes(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        return await call_next(request)

elif KIND == "mounted":
    # A mount does not run its app's lifespan: the outer app runs it, for the app it mounts.
    outer = FastAPI(lifespan=lambda _: counter.router.lifespan_context(counter))
    outer.mount("/app", counter)
    app = outer
elif KIND == "telemetry":
    traced = FastAPI(telemetry={"tracer_provider": TracerProvider()})
    traced.include_router(example.lith.router)
    example.lith.command(traced, "/add", example.Add)
    traced.add_api_route("/direct", direct)
    app = traced
else:
    raise ValueError(f"LAYERS_KIND: {KIND!r} is none of known, recorder, http, mounted, telemetry")
