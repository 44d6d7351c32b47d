"""A stream's body straight to the server, past layers that only watch a response begin.

Every chunk a tab's stream writes would go through each ASGI layer's `send` on its way to the
server: Starlette's error and exception layers, FastAPI's, the app's own middleware
(`SecurityHeaders`, sessions, CORS) and the route's. Each of those looks at
`http.response.start` alone and hands a body on as it came, yet at thousands of tabs their
calls were a quarter of the loop's work per frame (bench/RESULTS.md). So once its headers went
through them all, a stream's body goes to uvicorn's own `send`, when every layer between the
server and the route is one known to leave bodies alone (the route's own wrapper is Starlette's,
which watches for the start alone). A layer of any other kind (one that compresses, logs,
counts or buffers bodies, `@app.middleware("http")`), another server, an app mounted inside
another or FastAPI's own telemetry keeps the whole chain, as before.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send

__all__ = ["server_send"]

# Layers that change no `http.response.body` message and keep none back; all but the first act
# on `http.response.start` alone, if at all. Named, not imported: one a version renames or
# drops is not known any more, and the body takes the chain.
PASSES_BODIES = frozenset({
    "uvicorn.middleware.proxy_headers.ProxyHeadersMiddleware",  # the scope's client and scheme
    "starlette.middleware.errors.ServerErrorMiddleware",
    "starlette.middleware.exceptions.ExceptionMiddleware",
    "starlette.middleware.sessions.SessionMiddleware",
    "starlette.middleware.cors.CORSMiddleware",
    "starlette.middleware.trustedhost.TrustedHostMiddleware",
    "starlette.middleware.httpsredirect.HTTPSRedirectMiddleware",
    "fastapi.middleware.asyncexitstack.AsyncExitStackMiddleware",
    "fastapi.telemetry._asgi.ExceptionTelemetryMiddleware",
    "fastapi._body_limit.AppBodyLimitMiddleware",
    "fastapi._body_limit._BodyLimitExceptionMiddleware",
    "fastapi_lith.web.headers.SecurityHeaders",
})  # fmt: skip


def server_send(scope: Scope, receive: Receive) -> Send | None:
    """uvicorn's `send` for this request, if every layer from the server to the route passes
    bodies through untouched; else None: the body goes through the layers' `send`."""
    if "fastapi.telemetry" in scope:  # FastAPI's own telemetry ends its span at the body's end
        return None
    # An unwrapped `receive` is bound to uvicorn's request cycle, whose protocol holds the app
    # uvicorn calls; another server's, or one a layer wrapped, leads nowhere.
    cycle: Any = getattr(receive, "__self__", None)
    protocol = getattr(getattr(cycle, "on_response", None), "__self__", None)
    app = scope.get("app")
    router = getattr(app, "router", None)
    # The server's app down to the one that routed this request, then that one's middleware
    # down to its router. An app mounted inside another is routed by the outer one's router,
    # which this walk never meets: then nothing is known of what lies between.
    if router is None or not _passes(getattr(protocol, "app", None), app):
        return None
    if not _passes(getattr(app, "middleware_stack", None), router):
        return None
    send: Send = cycle.send
    return send


def _passes(layer: Any, end: Any) -> bool:
    """Whether each layer from `layer` down to `end`, through their `.app`, passes bodies on."""
    while layer is not end:
        if _name(layer) not in PASSES_BODIES:
            return False
        layer = layer.app  # each of them wraps the next as `.app`
    return True


def _name(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"
