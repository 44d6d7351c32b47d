"""Command routes, guarded: a bound on the body, and errors a Datastar page can show.

Datastar ignores the body of a non-2xx response, so a refused command (400, 403, 409, 413, 422)
is answered with an HTML fragment *and* that fragment is pushed down the acting tab's stream,
the tab named by the command's `tab` signal or form field; its `op` comes back as `done`, so a
button pending on `$op != $done` stops. Every byte here comes from a client: whatever it is,
the answer is a 4xx, never a 500.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from email.message import Message as _Header
from typing import Any

import htpy as h
from fastapi import FastAPI, routing
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import settings
from ..engine.commands import TAB_ID, TAB_PATTERN, Command, TabCommand, server_fields
from ..engine.frames import Frame
from ..exceptions import BadParameter, LithError, Rejected, StorageError

# An app's own wording for a validation error: pydantic's error dict in, the message out (None
# keeps pydantic's). Its `type` says what failed ("string_too_short", "json_invalid", ...).
Messages = Callable[[Mapping[str, Any]], str | None]


class BodyTooLarge(HTTPException):
    """A command's body passed `max_body`; `head` is what was read of it, for its tab and op."""

    def __init__(self, limit: int, head: bytes) -> None:
        super().__init__(413, f"The request is too large: at most {limit} bytes.")
        self.head = head


class MaxBody:
    """A command route's own body limit, in place of the app's `max_body`: an upload route.

    ```python
    @app.post("/photos", dependencies=[Depends(MaxBody(20 * 2**20))])
    async def add_photo(file: UploadFile, tab: str = Form(), writer: Writer = Depends(lith.writer)): ...
    ```

    A marker `BodyLimit` finds among the route's dependencies, as it finds the writer; calling
    it does nothing. `lith.command(..., max_body=...)` adds one.
    """

    def __init__(self, limit: int) -> None:
        self.limit: int = settings.number("max_body", limit, low=1, integer=True)

    async def __call__(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"MaxBody({self.limit})"


class GuardedRoute:
    """A command route's ASGI app, wrapped: its body bounded, its errors answered as HTML.

    FastAPI reads the body before any dependency runs, so `Depends(lith.writer)` sees it too
    late; the bound wraps `receive` instead, and the route's own errors go to `handlers` (the
    web layer's, over the app's), which Starlette looks up in the request's scope. Wrapping
    the route rather than the app leaves the host app's middleware stack as it was built, and
    every other route alone. A body is refused as soon as it passes `limit`, so memory holds at
    most the limit plus one chunk; a `Content-Length` over the limit is refused before a byte is
    read, unless Datastar sent it: then the start of the body is read, for the tab to tell. Only
    the first `keep` bytes are kept for the error handlers, whatever the limit: the tab and op
    come first.
    """

    def __init__(self, app: ASGIApp, *, owner: object, limit: int, keep: int, handlers: Mapping[Any, Any]) -> None:
        self.app = app
        self.owner = owner  # the writer dependency whose guard this is
        self.limit = limit
        self.keep = keep
        self.handlers = dict(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, keep = self.limit, self.keep
        chunks: list[bytes] = []
        size = kept = 0
        state = scope.setdefault("state", {})
        state["lith_command"] = True  # what the handlers and the writer dependency look for
        state["lith_body"] = chunks
        scope[GUARD_KEY] = self.owner
        app_handlers, status_handlers = scope.get("starlette.exception_handlers", ({}, {}))
        scope["starlette.exception_handlers"] = (
            {**app_handlers, **self.handlers},
            {code: h for code, h in status_handlers.items() if not 400 <= code < 600},
        )
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        declared_over = False
        if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
            if headers.get("datastar-request") != "true":  # no tab to tell
                await self._refuse(scope, receive, send, BodyTooLarge(limit, b""))
                return
            declared_over = True  # read the start, to find its tab

        async def bounded_receive() -> Message:
            nonlocal size, kept
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                size += len(chunk)
                if kept < keep:
                    chunks.append(chunk[: keep - kept])
                    kept += len(chunks[-1])
                if size > limit or (declared_over and (kept >= keep or not message.get("more_body"))):
                    raise BodyTooLarge(limit, b"".join(chunks))
            return message

        await self.app(scope, bounded_receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, exc: BodyTooLarge) -> None:
        response = await self.handlers[HTTPException](Request(scope, receive), exc)
        await response(scope, receive, send)


# Set in a guarded route's scope: the writer dependency refuses to run without it.
GUARD_KEY = "lith.guard"


class BadRequest(HTTPException, BadParameter):
    """A `BadParameter` a page's render met (`lith.render`): answered 400 with the reason by
    FastAPI's own handler, however the app was set up, and still a `BadParameter` to an app that
    catches one."""

    def __init__(self, reason: str) -> None:
        super().__init__(400, reason)


def api_routes(routes: Sequence[Any]) -> Iterator[tuple[routing.APIRoute, Any]]:
    """Every FastAPI route among `routes`, included routers too, with what serves it as the app
    mounted it: its `dependencies` (the inclusion's among them), `dependant` and `app`."""
    # FastAPI (0.16x) keeps an included router's routes apart, each with the app that serves it;
    # an older one copies them into the app's own list.
    walk = getattr(routing, "_iter_routes_with_context", None)
    pairs = walk(routes) if walk is not None else ((route, None) for route in routes)
    for route, context in pairs:
        if isinstance(route, routing.APIRoute):
            yield route, route if context is None else context


def command_routes(routes: Sequence[Any], writer: object) -> Iterator[tuple[Any, int | None]]:
    """Every FastAPI route among `routes` (included routers too) whose dependencies hold
    `writer` or a `MaxBody`, as (the object whose `app` serves it, `MaxBody`'s limit or None).

    A route of an included router is served by its inclusion's own app (FastAPI builds one per
    inclusion), so that is the one to wrap; a route added after start-up gets a new one, which
    the writer dependency finds unguarded and refuses.
    """
    for route, holder in api_routes(routes):
        found, limit, open_bodies = _limit_of(holder.dependant, writer)
        if open_bodies:
            name = open_bodies[0].__name__
            raise LithError(
                f"{' '.join(sorted(route.methods or ()))} {route.path} takes {name} as its body, so its FromServer "
                f"fields would come from the client: take cmd: Annotated[{name}, Depends(lith.body({name}))]"
            )
        if found:
            yield holder, limit


def _limit_of(dependant: Any, writer: object) -> tuple[bool, int | None, list[type[Command]]]:
    """Walk a route's dependency tree: whether it holds the writer or a `MaxBody`, the
    smallest `MaxBody` found (None: the app's `max_body`), and the commands with server fields
    it would read whole from the body (FastAPI's own validation knows nothing of `FromServer`)."""
    found, limits, open_bodies = False, [], []
    stack = [dependant] if dependant is not None else []
    while stack:
        dep = stack.pop()
        if dep.call is writer:
            found = True
        elif isinstance(dep.call, MaxBody):
            limits.append(dep.call.limit)
        for param in dep.body_params:
            kind = param.field_info.annotation
            if isinstance(kind, type) and issubclass(kind, Command) and server_fields(kind):
                open_bodies.append(kind)
        stack.extend(dep.dependencies)
    return found or bool(limits), (min(limits) if limits else None), open_bodies


def is_command_request(request: Request) -> bool:
    """A request Datastar sent, or one the writer dependency marked as a command's."""
    return request.headers.get("datastar-request") == "true" or bool(
        getattr(request.state, "lith_command", False)
    )


Push = Callable[[Request, str, Frame], None]


def add_error_handlers(app: FastAPI, *, error_id: str, messages: Messages | None, push: Push) -> None:
    """`error_handlers` on the whole app: a Datastar request to any route gets HTML errors."""
    handlers = error_handlers(app.exception_handlers, error_id=error_id, messages=messages, push=push)
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)


# An app's exception handler as these handlers await it (FastAPI's own are async).
Handler = Callable[[Request, Exception], Awaitable[Response]]


def error_handlers(
    app_handlers: Mapping[Any, Any], *, error_id: str, messages: Messages | None, push: Push
) -> dict[Any, Callable[[Request, Exception], Any]]:
    """On a command request (one Datastar sent, or one the writer dependency marked) a 4xx
    answer becomes an HTML fragment, also `push`ed to the acting tab with `done` set (the
    request says where the tab lives: one app, or one account of many). A `Rejected` that a
    route lets through is answered as `lith.command` answers it, and a command the route built
    itself (from form fields) that fails validation is a 422 like FastAPI's own. Other requests
    get the app's handlers as they were (FastAPI's own by default)."""
    validation_fallback: Handler = app_handlers.get(RequestValidationError, request_validation_exception_handler)
    http_fallback: Handler = app_handlers.get(HTTPException, http_exception_handler)
    pydantic_fallback: Handler | None = app_handlers.get(ValidationError)
    rejected_fallback: Handler | None = app_handlers.get(Rejected)

    def tell(request: Request, exc: Exception, html: str) -> None:
        tab, op = acting_tab(received_body(request, exc), request.headers.get("content-type"))
        if tab is not None:
            push(request, tab, Frame(error_id, html, {"done": op} if op is not None else None))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, (RequestValidationError, ValidationError)) and is_command_request(request):
            html = validation_fragment(exc, error_id, messages)
            tell(request, exc, html)
            return HTMLResponse(html, status_code=422)
        if isinstance(exc, RequestValidationError):
            return await validation_fallback(request, exc)
        if pydantic_fallback is not None:
            return await pydantic_fallback(request, exc)
        raise exc  # a model the app built outside a command route: its bug, a 500 as before

    async def on_http_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and 400 <= exc.status_code < 500 and is_command_request(request):
            html = http_error_fragment(exc, error_id)
            tell(request, exc, html)
            return HTMLResponse(html, status_code=exc.status_code, headers=exc.headers)
        return await http_fallback(request, exc)

    async def on_rejected(request: Request, exc: Exception) -> Response:
        if rejected_fallback is not None and not is_command_request(request):
            return await rejected_fallback(request, exc)
        conflict = refusal(exc)
        return Response(status_code=204) if conflict is None else await on_http_error(request, conflict)

    async def on_bad_parameter(request: Request, exc: Exception) -> Response:
        return await http_fallback(request, HTTPException(400, str(exc)))

    async def on_storage_error(request: Request, exc: Exception) -> Response:
        headers = {"Retry-After": "5"}
        if not is_command_request(request):
            return PlainTextResponse(STORAGE_MESSAGE, status_code=503, headers=headers)
        html = http_error_fragment(HTTPException(503, STORAGE_MESSAGE), error_id)
        tab, op = acting_tab(received_body(request, exc))
        if tab is not None:
            push(request, tab, Frame(error_id, html, {"done": op} if op is not None else None))
        return HTMLResponse(html, status_code=503, headers=headers)

    return {
        RequestValidationError: on_validation_error,
        ValidationError: on_validation_error,
        HTTPException: on_http_error,
        Rejected: on_rejected,
        BadParameter: on_bad_parameter,
        # A full disk: no command is at fault, so a 503, and on a command request the HTML
        # fragment is pushed to the acting tab with `done`, like a refused command.
        StorageError: on_storage_error,
    }


def refusal(exc: Exception) -> HTTPException | None:
    """How a command route answers a `Rejected`: None (a 204) for a tab command, whose outcome
    view already says why; a 409 with the message for any other (Datastar ignores the body of
    an error, so the handler also pushes it to the acting tab). A tab command with op 0 is no
    click: no outcome holds its message, so it is a 409 too."""
    command = getattr(exc, "command", None)
    return None if isinstance(command, TabCommand) and command.op else HTTPException(409, str(exc))


STORAGE_MESSAGE = "The app cannot save changes right now, so nothing changed. Try again in a moment."


def received_body(request: Request, exc: Exception) -> Any:
    """What the handlers can read of a refused command's body, without reading it again."""
    if isinstance(exc, RequestValidationError) and exc.body is not None:
        return exc.body
    if isinstance(exc, BodyTooLarge):
        return exc.head
    chunks = getattr(request.state, "lith_body", None)
    return b"".join(chunks) if chunks else None


_TAB = re.compile(rb'"tab"\s*:\s*"(' + TAB_PATTERN.encode() + rb')"')
_OP = re.compile(rb'"op"\s*:\s*(\d{1,18})\b')
# A form's fields, urlencoded (the tab id needs no escaping) or multipart (a part's headers,
# a blank line, its value), found in the start of the body.
_FORM_TAB = re.compile(rb"(?:^|&)tab=(" + TAB_PATTERN.encode() + rb")(?:&|$)")
_FORM_OP = re.compile(rb"(?:^|&)op=(\d{1,18})(?:&|$)")
_PART_TAB = re.compile(rb'; name="tab"\r\n(?:[^\r\n]+\r\n)*\r\n(' + TAB_PATTERN.encode() + rb")\r\n")
_PART_OP = re.compile(rb'; name="op"\r\n(?:[^\r\n]+\r\n)*\r\n(\d{1,18})\r\n')


def acting_tab(body: Any, content_type: str | None = None) -> tuple[str | None, int | None]:
    """The `tab` and `op` of a command's body: a JSON object's signals or a form's fields,
    parsed or found in the start of the body (cut off at the limit, nested too deep, not JSON).
    Any bytes at all: the answer is a tab and op or None, never an exception."""
    if isinstance(body, str):
        body = body.encode(errors="surrogateescape")
    if isinstance(body, bytes):
        media = media_type(content_type)
        if media == "application/x-www-form-urlencoded":
            return _found(_FORM_TAB.search(body), _FORM_OP.search(body))
        if media == "multipart/form-data":
            return _found(_PART_TAB.search(body), _PART_OP.search(body))
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            return _found(_TAB.search(body), _OP.search(body))
    if not isinstance(body, Mapping):  # a parsed JSON object, or a form's FormData
        return None, None
    tab, op = body.get("tab"), body.get("op")
    if isinstance(op, str) and op.isascii() and op.isdigit() and len(op) <= 18:
        op = int(op)  # a form field
    return (
        tab if isinstance(tab, str) and TAB_ID.fullmatch(tab) else None,
        op if type(op) is int and 0 <= op < 2**63 else None,  # an op a TabCommand could carry
    )


def _found(tab: re.Match[bytes] | None, op: re.Match[bytes] | None) -> tuple[str | None, int | None]:
    return (tab.group(1).decode() if tab else None), (int(op.group(1)) if op else None)


def media_type(content_type: str | None) -> str:
    """`multipart/form-data` of `multipart/form-data; boundary=...`, as FastAPI reads it."""
    if not content_type:
        return ""
    header = _Header()
    header["content-type"] = content_type
    return header.get_content_type()


def validation_fragment(
    exc: RequestValidationError | ValidationError, element_id: str, messages: Messages | None = None
) -> str:
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
