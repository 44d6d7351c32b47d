"""Command routes, guarded: a bound on the body, and errors a Datastar page can show.

Datastar ignores the body of a non-2xx response, so a refused command (400, 403, 413, 422) is
answered with an HTML fragment *and* that fragment is pushed down the acting tab's stream, the
tab named by the command's `tab` signal; its `op` signal comes back as `done`, so a button
pending on `$op != $done` stops.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import htpy as h
from fastapi import Depends, FastAPI
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .commands import TAB_ID, TAB_PATTERN, Command, Rejected, TabCommand
from .exceptions import StorageError
from .streams import Frame

# An app's own wording for a validation error: pydantic's error dict in, the message out (None
# keeps pydantic's). Its `type` says what failed ("string_too_short", "json_invalid", ...).
Messages = Callable[[Mapping[str, Any]], str | None]


class BodyTooLarge(HTTPException):
    """A command's body passed `max_body`; `head` is what was read of it, for its tab and op."""

    def __init__(self, limit: int, head: bytes) -> None:
        super().__init__(413, f"The request is too large: at most {limit} bytes.")
        self.head = head


class BodyLimit:
    """ASGI middleware: the body of a request to a route that takes the writer stops at
    `max_body` bytes, 413 at once.

    FastAPI reads the body before any dependency runs, so `Depends(lith.writer)` sees it too
    late; the bound wraps `receive` instead. When the body is first read, routing is done and
    `scope["route"]` names the route: it is bounded if `writer` is among the route's
    dependencies (looked up once per route and remembered), so any FastAPI route that takes
    `Depends(lith.writer)` is covered and every other route is left alone. A body is refused
    as soon as it passes the limit, so memory holds at most the limit plus one chunk; a
    `Content-Length` over the limit is refused before a byte is read, unless Datastar sent it:
    then the first `max_body` bytes are read, for the tab to tell.
    """

    def __init__(self, app: ASGIApp, *, writer: object, max_body: int) -> None:
        self.app = app
        self.writer = writer
        self.max_body = max_body
        self._routes: dict[int, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body
        bounded: bool | None = None  # decided at the first read, once routing is done
        chunks: list[bytes] = []
        size = 0

        async def bounded_receive() -> Message:
            nonlocal bounded, size
            if bounded is None:
                bounded = self.takes_writer(scope.get("route"))
                if bounded:
                    # A command's request, as the writer dependency would mark it; the body is
                    # kept for the error handlers: the tab and op of a refused command.
                    state = scope.setdefault("state", {})
                    state["lith_command"] = True
                    state["lith_body"] = chunks
                    headers = Headers(scope=scope)
                    length = headers.get("content-length")
                    if (
                        length is not None and length.isdigit() and int(length) > limit
                        and headers.get("datastar-request") != "true"  # else read on, to find its tab
                    ):
                        raise BodyTooLarge(limit, b"")
            message = await receive()
            if bounded and message["type"] == "http.request":
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    chunks.append(chunk[: limit - size + len(chunk)])
                    raise BodyTooLarge(limit, b"".join(chunks))
                chunks.append(chunk)
            return message

        await self.app(scope, bounded_receive, send)

    def takes_writer(self, route: Any) -> bool:
        if route is None:
            return False
        known = self._routes.get(id(route))
        if known is None:
            known = self._routes[id(route)] = _depends_on(getattr(route, "dependant", None), self.writer)
        return known


def _depends_on(dependant: Any, call: object) -> bool:
    stack = [dependant] if dependant is not None else []
    while stack:
        dep = stack.pop()
        if dep.call is call:
            return True
        stack.extend(dep.dependencies)
    return False


def is_command_request(request: Request) -> bool:
    """A request Datastar sent, or one the writer dependency marked as a command's."""
    return request.headers.get("datastar-request") == "true" or bool(
        getattr(request.state, "lith_command", False)
    )


def add_error_handlers(
    app: FastAPI, *, error_id: str, messages: Messages | None, push: Callable[[Request, str, Frame], None]
) -> None:
    """On a command request (one Datastar sent, or one the writer dependency marked) a 4xx
    answer becomes an HTML fragment, also `push`ed to the acting tab with `done` set (the
    request says where the tab lives: one app, or one account of many). Other
    requests get the app's handlers as they were (FastAPI's own by default)."""
    validation_fallback = app.exception_handlers.get(RequestValidationError, request_validation_exception_handler)
    http_fallback = app.exception_handlers.get(HTTPException, http_exception_handler)

    def tell(request: Request, exc: Exception, html: str) -> None:
        tab, op = acting_tab(received_body(request, exc))
        if tab is not None:
            push(request, tab, Frame(error_id, html, {"done": op} if op is not None else None))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RequestValidationError) and is_command_request(request):
            html = validation_fragment(exc, error_id, messages)
            tell(request, exc, html)
            return HTMLResponse(html, status_code=422)
        return await validation_fallback(request, exc)  # type: ignore[misc]

    async def on_http_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and 400 <= exc.status_code < 500 and is_command_request(request):
            html = http_error_fragment(exc, error_id)
            tell(request, exc, html)
            return HTMLResponse(html, status_code=exc.status_code, headers=exc.headers)
        return await http_fallback(request, exc)  # type: ignore[misc]

    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)


STORAGE_MESSAGE = "The app cannot save changes right now, so nothing changed. Try again in a moment."


def add_storage_error_handler(app: FastAPI, *, error_id: str, push: Callable[[Request, str, Frame], None]) -> None:
    """A `StorageError` (a full disk: no command is at fault) answers 503, and on a command
    request the HTML fragment is pushed to the acting tab with `done`, like a refused command."""

    async def on_storage_error(request: Request, exc: Exception) -> Response:
        headers = {"Retry-After": "5"}
        if not is_command_request(request):
            return PlainTextResponse(STORAGE_MESSAGE, status_code=503, headers=headers)
        html = http_error_fragment(HTTPException(503, STORAGE_MESSAGE), error_id)
        tab, op = acting_tab(received_body(request, exc))
        if tab is not None:
            push(request, tab, Frame(error_id, html, {"done": op} if op is not None else None))
        return HTMLResponse(html, status_code=503, headers=headers)

    app.add_exception_handler(StorageError, on_storage_error)


def received_body(request: Request, exc: Exception) -> Any:
    """What the handlers can read of a refused command's body, without reading it again."""
    if isinstance(exc, RequestValidationError):
        return exc.body
    if isinstance(exc, BodyTooLarge):
        return exc.head
    chunks = getattr(request.state, "lith_body", None)
    return b"".join(chunks) if chunks else None


_TAB = re.compile(rb'"tab"\s*:\s*"(' + TAB_PATTERN.encode() + rb')"')
_OP = re.compile(rb'"op"\s*:\s*(\d{1,18})\b')


def acting_tab(body: Any) -> tuple[str | None, int | None]:
    """The `tab` and `op` signals of a command's body: parsed, or found in a cut-off body."""
    if isinstance(body, str):
        body = body.encode()
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except ValueError:  # cut off at the limit, or not JSON: look for the two signals
            tab, op = _TAB.search(body), _OP.search(body)
            return (tab.group(1).decode() if tab else None), (int(op.group(1)) if op else None)
    if not isinstance(body, dict):
        return None, None
    tab, op = body.get("tab"), body.get("op")
    return (
        tab if isinstance(tab, str) and TAB_ID.fullmatch(tab) else None,
        op if type(op) is int else None,
    )


def validation_fragment(exc: RequestValidationError, element_id: str, messages: Messages | None = None) -> str:
    """A short, escaped list of what was wrong, with an id Datastar can patch by."""
    items = []
    for error in exc.errors():
        loc = [] if error.get("type") == "json_invalid" else error.get("loc", ())  # a byte offset
        field = ".".join(str(part) for part in loc if part not in ("body", "query", "path"))
        msg = (messages(error) if messages is not None else None) or error.get("msg", "invalid")
        items.append(h.li[h.strong[field], ": ", msg] if field else h.li[msg])
    return str(h.div(id=element_id, role="alert", class_="lith-error")[h.ul[items]])


def http_error_fragment(exc: HTTPException, element_id: str) -> str:
    """An HTTP error's detail in the same shape as a validation error's."""
    return str(h.div(id=element_id, role="alert", class_="lith-error")[h.ul[h.li[str(exc.detail)]]])


def command_endpoint(writer: Callable[..., Any], command: type[Command]) -> Callable[..., Any]:
    """The endpoint of `lith.command`: validate the body as `command`, apply it, answer 204.

    A `Rejected` tab command still answers 204: the tab's outcome view already carries the
    message (Datastar ignores an error's body). Any other command's `Rejected` is a 409 with the
    message, which `Lith.install`'s handler shows in the page's `#lith-error`.
    """

    async def endpoint(cmd: Command, lith_writer: Any) -> Response:
        try:
            await lith_writer.do(cmd)
        except Rejected as exc:
            if not isinstance(cmd, TabCommand):
                raise HTTPException(409, str(exc)) from None
        return Response(status_code=204)

    # FastAPI reads the signature: the body is `command`, the writer a dependency (which the
    # body limit and the error handlers recognise).
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("cmd", kind, annotation=command),
            inspect.Parameter("lith_writer", kind, default=Depends(writer), annotation=Any),
        ],
        return_annotation=Response,
    )
    endpoint.__name__ = endpoint.__qualname__ = command.__name__
    return endpoint
