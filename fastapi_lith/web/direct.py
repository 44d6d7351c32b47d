"""A `lith.command` route served without FastAPI's dependency solving, with FastAPI's answers.

Such a route's parameters never vary: the writer, and the body as the command. FastAPI still
solves its dependency tree on every request (a cache key per dependency, the stacks for those
that yield), and at hundreds of commands a second that was most of a POST's time on the event
loop, the thread every stream's frames wait for. Here the same functions are called in the same
order, directly: the body read as FastAPI reads it, then the writer dependency (same origin, the
idempotency key), then the body dependency (the command validated, or FastAPI's own 422), then
`writer.do`; every exception goes to the handlers FastAPI's route would have reached.

Anything more on the route is FastAPI's to serve, as before: a dependency of the route's or its
router's, a `FromServer` field, a request's engine that takes parameters (`Accounts`), a route
or app body limit of FastAPI's own, FastAPI's telemetry on for the request, or an override of
any of the route's dependencies (`app.dependency_overrides`, read on every request).
"""

from __future__ import annotations

import email.message
import functools
import inspect
import json
from collections.abc import Callable
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import request_response
from starlette.types import ASGIApp, Receive, Scope, Send

from .guard import MaxBody

telemetry: Callable[[], Any] | None
try:  # a FastAPI with request telemetry, read only when an app turns it on
    from fastapi.telemetry import get_telemetry_data as telemetry
except ImportError:  # pragma: no cover - an older FastAPI has none
    telemetry = None

try:  # a Starlette with body limits: FastAPI's `max_body_size` marks the request's scope
    from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
except ImportError:  # pragma: no cover
    MAX_BODY_SIZE_SCOPE_KEY = "fastapi_lith.no-body-limit"

NO_BODY = object()  # an empty body: FastAPI's "Field required" (JSON `null` is a value)


class DirectRoute:
    """The ASGI app of a `lith.command` route: `handle` unless FastAPI must serve the request
    (`fallback`, the route's own app), because one of the route's dependencies is overridden,
    telemetry is on, or FastAPI bounds the body."""

    def __init__(
        self, fallback: ASGIApp, handle: Callable[[Request], Any], calls: frozenset[Any], provider: Any
    ) -> None:
        self.fallback = fallback
        self.app = request_response(handle)
        self.calls = calls
        self.provider = provider

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        overrides = getattr(self.provider, "dependency_overrides", None)
        if (
            (overrides and not self.calls.isdisjoint(overrides))
            or MAX_BODY_SIZE_SCOPE_KEY in scope
            or (telemetry is not None and telemetry() is not None)
        ):
            await self.fallback(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def direct_route(
    holder: Any, *, writer: Any, current: Callable[..., Any], body: Callable[..., Any]
) -> DirectRoute | None:
    """`holder`'s app served directly, or None if the route has more than the library's own
    dependencies: `writer` (over `current`, the request's engine) and `body`, the command's."""
    dependant = getattr(holder, "dependant", None)
    takes_nothing = inspect.iscoroutinefunction(current) and not inspect.signature(current).parameters
    if dependant is None or not takes_nothing or getattr(holder, "max_body_size", None) is not None:
        return None
    calls: set[Any] = set()
    stack = list(dependant.dependencies)
    while stack:
        dep = stack.pop()
        if not (dep.call in (writer, current, body) or isinstance(dep.call, MaxBody)):
            return None
        calls.add(dep.call)
        stack.extend(dep.dependencies)
    if writer not in calls or body not in calls:
        return None
    calls.add(dependant.call)
    strict = _strict_content_type(holder)

    async def handle(request: Request) -> Response:
        sent = await read_body(request, strict=strict)
        lith_writer = await writer(request, await current())
        if sent is NO_BODY:
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}], body=None
            )
        cmd = await body(request=request, lith_writer=lith_writer, sent=sent)
        await lith_writer.do(cmd)
        return Response(status_code=204)

    return DirectRoute(holder.app, handle, frozenset(calls), getattr(holder, "dependency_overrides_provider", None))


async def read_body(request: Request, *, strict: bool) -> Any:
    """The body as FastAPI reads a route's one body parameter: JSON when its content type says
    so (or none is sent, unless `strict`), else the bytes (a form, read again as one later);
    `NO_BODY` when it is empty. FastAPI's own errors for a body it cannot parse."""
    try:
        raw = await request.body()
        if not raw:
            return NO_BODY
        content_type = request.headers.get("content-type")
        if not content_type:
            return raw if strict else json.loads(raw)
        return json.loads(raw) if _json_type(content_type) else raw
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {},
              "ctx": {"error": exc.msg}}],
            body=exc.doc,
        ) from exc
    except HTTPException:
        raise  # the guard's body limit
    except Exception as exc:
        raise HTTPException(400, "There was an error parsing the body") from exc


@functools.lru_cache(maxsize=64)
def _json_type(content_type: str) -> bool:
    """Whether FastAPI reads a body of `content_type` as JSON (parsed as it parses it: a page
    sends the same few types, so each is parsed once)."""
    header = email.message.Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _strict_content_type(holder: Any) -> bool:
    """FastAPI's `strict_content_type` for the route, on by default where it exists; a FastAPI
    without it reads a body sent with no content type as JSON."""
    value = getattr(holder, "strict_content_type", False)
    return bool(getattr(value, "value", value))  # a `DefaultPlaceholder`, or the route's own

