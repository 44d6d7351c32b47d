"""`Depends(lith.writer)`: the engine's writer, handed to a command route once its request passes.

The engine's `Writer` knows nothing of HTTP; this is where a request becomes a command's: a
cross-site request is refused (origin.py), a route the web layer did not guard (guard.py) is
refused, and an `Idempotency-Key` header keys the route's commands,
the first `do` `header:KEY:1`, the next `header:KEY:2`, so a retried request applies none twice
(with the request's principal in the key once the route has asked it, `header:"alice":KEY:1`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from fastapi import Depends, HTTPException
from starlette.requests import Request

from ..engine.commands import Command
from ..engine.engine import Engine
from ..engine.outcomes import IDEMPOTENCY_KEY
from ..engine.writer import Writer
from ..exceptions import LithError
from .guard import GUARD_KEY
from .identity import asked
from .origin import cross_site_reason


class KeyedWriter:
    """The writer as one request with an `Idempotency-Key` sees it: its commands keyed in order."""

    __slots__ = ("writer", "key", "sent")

    def __init__(self, writer: Writer, key: str) -> None:
        self.writer = writer
        self.key = key
        self.sent = 0

    async def do(self, cmd: Command, *, key: str | None = None) -> Any:
        self.sent += 1
        if key is None:
            # Keys are the client's to choose: under a principal the request established, one
            # person's key can neither read another's outcome nor stop their command applying.
            who = asked()
            mine = f"{json.dumps(who[0])}:" if who is not None and who[0] is not None else ""
            key = f"header:{mine}{self.key}:{self.sent}"
        return await self.writer.do(cmd, key=key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


class WriterDependency:
    """`lith.writer`: a FastAPI dependency for command routes, and, for one engine, the writer
    itself elsewhere (`await lith.writer.do(cmd)` in a background task; its counters).

    `current`, from the web layer, is its request -> engine dependency (one `Lith`'s engine, or
    the request's account), and then only a route it guarded is served (`guarded`); FastAPI
    reads the signature, so each instance carries its own. Without it, `writer` serves alone.
    """

    def __init__(
        self, writer: Writer | None = None, *, current: Callable[..., Any] | None = None, same_origin_only: bool = True
    ) -> None:
        self.writer = writer
        self.same_origin_only = same_origin_only
        self.guarded = current is not None
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter("request", kind, annotation=Request)]
        if current is not None:
            params.append(inspect.Parameter("engine", kind, default=Depends(current), annotation=Any))
        self.__signature__ = inspect.Signature(params)

    async def __call__(self, request: Request, engine: Engine | None = None) -> Writer | KeyedWriter:
        """Refuse cross-site and non-Datastar requests (see origin.py); non-browser clients and
        tests turn that off (`same_origin_only=False`). Key the request's commands by its
        `Idempotency-Key`, if any. A route the web layer did not guard (no body limit, no HTML
        errors: see guard.py) is refused loudly rather than served unbounded."""
        if self.guarded and request.scope.get(GUARD_KEY) is not self:
            raise LithError(
                f"{request.method} {request.url.path} takes Depends(lith.writer) but is not guarded "
                "(body limit, HTML errors): include lith.router (or accounts.router) in the app that "
                "serves it, app.include_router(lith.router), and add its routes before the app starts"
            )
        request.state.lith_command = True
        writer = engine.writer if engine is not None else self._writer()
        if self.same_origin_only:
            reason = cross_site_reason(request)
            if reason:
                raise HTTPException(403, reason)
        key = request.headers.get("idempotency-key")
        if key is None:
            return writer
        if not IDEMPOTENCY_KEY.fullmatch(key):
            raise HTTPException(400, "Idempotency-Key must be 1 to 200 visible ASCII characters")
        return KeyedWriter(writer, key)

    async def do(self, cmd: Command, *, key: str | None = None) -> Any:
        return await self._writer().do(cmd, key=key)

    def _writer(self) -> Writer:
        if self.writer is None:
            raise LithError("accounts.writer has no writer of its own outside a request: use accounts.use(name)")
        return self.writer

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and inspect probe these: none is the writer's
            raise AttributeError(name)
        return getattr(self._writer(), name)

    def __repr__(self) -> str:
        return f"WriterDependency({self.writer!r})"
