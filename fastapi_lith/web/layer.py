"""The web layer over one engine or a pool of them: what `Lith` and `Accounts` both serve.

Given a request -> engine resolver (one `Lith`'s engine, or the request's account), it holds the
stream route, the writer dependency and its guard (the body limit and the HTML error answers of
every route that takes it), command routes, and the page's helpers that depend on where the
stream lives (`connect`, `datastar`).

`app.include_router(router)` is all an app does: the router carries the app's lifespan
(FastAPI merges an included router's lifespan into the app's and calls it with the app), and at
start-up the guard wraps each route that takes the writer (guard.py, `GuardedRoute`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import htpy as h
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from .. import settings
from ..engine import encoders
from ..engine.commands import TAB_ID, Command
from ..engine.encoders import Encoder
from ..engine.engine import Engine
from ..engine.frames import Frame
from ..engine.streams import Principal
from ..engine.views import Views
from ..engine.writer import Writer
from ..exceptions import AccessDenied, SettingError, ViewError
from .access import StreamRoute, StreamTokens, fill, page_principal
from .body import CommandBodies
from .dependency import WriterDependency
from .direct import direct_route
from .guard import (
    GuardedRoute,
    Messages,
    add_error_handlers,
    command_routes,
    error_handlers,
)
from .identity import principal_dependency
from .origin import same_origin_reason
from .page import DATASTAR_CDN, DATASTAR_NOTICE
from .sse import stream_response


@dataclass
class WebSettings:
    """The web layer's settings, each checked once, here (`Lith`'s docstring lists them).

    Each default is written here only: `Lith`'s signature reads its own from this class.
    """

    same_origin_only: bool = True
    max_body: int = 64 * 1024
    error_id: str = "lith-error"
    messages: Messages | None = None
    keepalive: float = 15.0
    hibernate_after: float = 30.0
    send_timeout: float = 10.0
    reconnect_within: float = 5.0
    encoders: dict[str, dict[str, int]] = field(default_factory=dict)
    datastar_url: str = DATASTAR_CDN
    datastar_integrity: str | None = None
    identity: Callable[..., Any] | None = None
    secret: str | Sequence[str] | None = None
    stream_max_age: float = 24 * 3600.0

    def __post_init__(self) -> None:
        settings.flag("same_origin_only", self.same_origin_only)
        settings.number("max_body", self.max_body, low=1, integer=True)
        if not isinstance(self.error_id, str) or not _HTML_ID.fullmatch(self.error_id):
            raise SettingError(
                f"error_id must be an HTML id (a letter, then letters, digits, '-' or '_'), not {self.error_id!r}"
            )
        if self.messages is not None and not callable(self.messages):
            raise SettingError(
                f"messages must be a function (pydantic error -> message or None), not {self.messages!r}"
            )
        for name in ("keepalive", "hibernate_after", "send_timeout"):
            settings.number(name, getattr(self, name), low=0.001)
        # Datastar's own retry interval is 1 s: a window below it would only bunch the herd.
        settings.number("reconnect_within", self.reconnect_within, low=1.0)
        if not isinstance(self.datastar_url, str) or not self.datastar_url:
            raise SettingError(f"datastar_url must be a URL or a path, not {self.datastar_url!r}")
        # Subresource Integrity: the browser runs the script only if its bytes have this hash.
        if self.datastar_integrity is not None and not (
            isinstance(self.datastar_integrity, str) and _INTEGRITY.fullmatch(self.datastar_integrity)
        ):
            raise SettingError(f"datastar_integrity must be like 'sha384-<base64>', not {self.datastar_integrity!r}")
        if self.identity is not None and not callable(self.identity):
            raise SettingError(f"identity must be a FastAPI dependency (a function), not {self.identity!r}")
        if self.secret is not None:
            keys = [self.secret] if isinstance(self.secret, str) else self.secret
            if not isinstance(keys, Sequence) or not keys or not all(
                isinstance(k, str) and len(k) >= _SECRET_MIN for k in keys
            ):
                raise SettingError(
                    f"secret must be a string of at least {_SECRET_MIN} characters, or a list of them "
                    "(the oldest first, the newest signs), not a shorter or other value"
                )
        settings.number("stream_max_age", self.stream_max_age, low=1)


class WebLayer:
    """The routes, dependencies and guards of an app over engines.

    `current` is a FastAPI dependency giving the request's engine (it may hold it open until
    the response is done, and answer 404/503); `engine_of(request)` is the engine it gave, or
    None, for the error handlers' pushes. `router` takes the stream route at `stream_path` and
    carries `lifespan`; `writer` is the engine's writer for use outside a request (one engine).
    """

    def __init__(
        self,
        config: WebSettings,
        *,
        current: Callable[..., Any],
        engine_of: Callable[[Request], Engine | None],
        views: Views,
        router: APIRouter,
        stream_path: str,
        writer: Writer | None = None,
    ) -> None:
        self.settings = config
        self.current = current
        self.engine_of = engine_of
        self.views = views
        self._router = router
        self._stream_path: str | None = stream_path
        self.writer = WriterDependency(writer, current=current, same_origin_only=config.same_origin_only)
        self.principal = principal_dependency(config.identity)
        self.body = CommandBodies(self.writer, self.principal)
        secret = config.secret
        self.tokens = StreamTokens(secret, config.stream_max_age) if secret is not None else None

    @property
    def router(self) -> APIRouter:
        """The router, its stream route added on first use. Only then: FastAPI keeps the
        callables of every route it builds in caches of its own (thousands of them), and an
        account's `Lith`, opened and closed by the thousand, is never served by itself."""
        if self._stream_path is not None:
            self._router.add_api_route(
                self._stream_path, self._stream_endpoint(), methods=["GET"], include_in_schema=False,
                route_class_override=StreamRoute,
            )
            self._stream_path = None
        return self._router

    # -- the app: guard its command routes ----------------------------------------------------

    def guard(self, app: FastAPI) -> None:
        """Wrap every route of `app` that takes the writer (or a `MaxBody`) in its guard.

        Called by the lifespan, with the app, once its routes are declared; again at the next
        start, it leaves wrapped routes as they are. The handlers answer the route's errors as
        HTML over the app's own handlers, which are the fallback for what is not a command's.
        A `lith.command` route with no dependencies but the library's is served directly
        (direct.py), with FastAPI's answers.
        """
        config = self.settings
        handlers = error_handlers(
            app.exception_handlers, error_id=config.error_id, messages=config.messages, push=self.push
        )
        for holder, limit in command_routes(app.router.routes, self.writer):
            if isinstance(holder.app, GuardedRoute) and holder.app.owner is self.writer:
                continue
            served = holder.app
            command = self.body.endpoints.get(getattr(holder, "endpoint", None))  # type: ignore[arg-type]
            if command is not None:
                direct = direct_route(holder, writer=self.writer, current=self.current, body=self.body(command))
                served = direct if direct is not None else served
            holder.app = GuardedRoute(
                served, owner=self.writer, limit=limit if limit is not None else config.max_body,
                keep=config.max_body, handlers=handlers,
            )

    def install(self, app: FastAPI) -> None:
        """`app.include_router(router)`, and HTML errors for a Datastar request to any route
        (a page's own `@get`), not only to those that take the writer."""
        app.include_router(self.router)
        config = self.settings
        add_error_handlers(app, error_id=config.error_id, messages=config.messages, push=self.push)

    def push(self, request: Request, tab: str, frame: Frame) -> None:
        engine = self.engine_of(request)
        if engine is not None:
            engine.push(tab, frame)

    def command(
        self, app: FastAPI | APIRouter, path: str, command: type[Command], *,
        dependencies: Sequence[Any] = (), max_body: int | None = None,
    ) -> None:
        """`POST path`: the body validated as `command`, applied by the writer, answered 204
        (see `Lith.command`)."""
        endpoint = self.body.endpoint(command, max_body)
        app.add_api_route(
            path, endpoint, methods=["POST"], status_code=204, include_in_schema=False,
            response_model=None, dependencies=list(dependencies) or None,
        )

    async def same_origin(self, request: Request) -> None:
        """`Depends(lith.same_origin)`: refuse a cross-site request (403) on a route that cannot
        take the writer's guard, such as a `navigator.sendBeacon` (it cannot send
        `Datastar-Request`). Off with `same_origin_only=False`, like the writer's."""
        if self.settings.same_origin_only:
            reason = same_origin_reason(request)
            if reason:
                raise HTTPException(403, reason)

    # -- the stream ---------------------------------------------------------------------------

    async def encoder(self, accept_encoding: str | None = Header(None)) -> Encoder:
        """`Depends(lith.encoder)`: the stream's compressor, from `Accept-Encoding`.

        zstd, else brotli, else gzip, else identity, honouring q-values. Override it to force
        or forbid one: `app.dependency_overrides[lith.encoder] = lambda: GzipEncoder()`.
        Async, so FastAPI calls it on the loop instead of a thread pool.
        """
        name = encoders.negotiate(accept_encoding)
        if name is None:
            raise HTTPException(406, "no acceptable Content-Encoding (zstd, br, gzip, identity)")
        return encoders.make_encoder(name, **self.settings.encoders.get(name, {}))

    def _stream_endpoint(self) -> Callable[..., Any]:
        async def stream(
            request: Request,
            engine: Engine = Depends(self.current),
            encoder: Encoder = Depends(self.encoder),
            principal: Principal = Depends(self.principal),
        ) -> Response:
            """`GET …/stream?views=counter,outcome/{tab}&tab=…`: one SSE response per tab.

            The identity is asked on every open and every reconnect (web/access.py)."""
            return await self.open_stream(engine, request, encoder, principal)

        return stream

    async def open_stream(
        self, engine: Engine, request: Request, encoder: Encoder, principal: Principal = None
    ) -> Response:
        """Validate the views and the tab id (400 with a plain message), check what `principal`
        may watch (a refusal), then stream."""
        config = self.settings
        return await stream_response(
            engine.hub.open, request, encoder, principal=principal, tokens=self.tokens,
            keepalive=config.keepalive, hibernate_after=config.hibernate_after, send_timeout=config.send_timeout,
            reconnect_within=config.reconnect_within,
        )

    # -- the page -----------------------------------------------------------------------------

    def connect(self, url: str, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` at `url`.

        `{tab}` and `{principal}` in a key are filled in; with a secret, the URL carries the
        token that binds the tab, the keys and the page's principal. `retry: 'always'`
        reconnects when the stream ends (a deploy) and, with no retry limit, whenever the
        network comes back. A key the stream would refuse is a `ViewError` (or an
        `AccessDenied`, another principal's) here.
        """
        if not TAB_ID.fullmatch(tab):
            raise ViewError(f"bad tab id {tab!r}: 1 to 64 letters, digits, '-' or '_'")
        principal: Principal = None
        if self.tokens is not None or any("{principal}" in k for k in keys):
            principal = page_principal(self.settings.identity, "lith.connect")
        keys = tuple(fill(k, tab, principal) for k in keys)
        self.views.for_tab(tab, keys, principal)
        views = ",".join(quote(k, safe="/{}") for k in keys)
        token = "" if self.tokens is None else f"&token={self.tokens.sign(url, tab, keys, principal)}"
        return stream_expression(url, f"views={views}&tab={tab}{token}")

    def render_params(self, key: str, params: dict[str, Any]) -> dict[str, Any]:
        """A page's `render(key, **params)`: `{principal}` is the page's own unless given."""
        if "{principal}" in key and "principal" not in params:
            principal = page_principal(self.settings.identity, f"rendering {key!r}")
            if principal is None:
                raise AccessDenied(f"view {key!r} needs a signed-in principal, and nobody is signed in")
            params = {**params, "principal": principal}
        return params

    def datastar(self) -> Markup:
        """Datastar's script and the notice shown if it cannot load: put it first in `<body>`.

        Nothing on a live page works without Datastar, so a failed load says so.
        """
        integrity = self.settings.datastar_integrity
        return Markup(h.fragment[
            h.p("#no-datastar", role="alert", hidden=True)["Datastar did not load: reload to try again."],
            h.script(
                type="module", src=self.settings.datastar_url, onerror=DATASTAR_NOTICE,
                integrity=integrity, crossorigin="anonymous" if integrity else None,
            ),
        ])


def stream_expression(url: str, query: str) -> str:
    """The `data-init` expression that opens a stream at `url?query` and keeps it open."""
    # The stream needs no signals: without the filter every reconnect would carry the
    # page's form drafts in its query string.
    options = "{retry: 'always', retryMaxCount: Infinity, filterSignals: {include: /^$/}}"
    return f"@get('{url}?{query}', {options})"


# A secret short enough to guess is no secret: `python -c 'import secrets; print(secrets.token_urlsafe())'`.
_SECRET_MIN = 16
_INTEGRITY = re.compile(r"(sha256|sha384|sha512)-[A-Za-z0-9+/]+={0,2}( (sha256|sha384|sha512)-[A-Za-z0-9+/]+={0,2})*")
_HTML_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
