"""`Depends(lith.writer)`: the engine's writer, handed to a command route once its request passes.

The engine's `Writer` knows nothing of HTTP; this is where a request becomes a command's: a
cross-site request is refused (origin.py), the request is marked so its errors are answered as
HTML for the acting tab (guard.py), and an `Idempotency-Key` header keys the route's commands,
the first `do` `header:KEY:1`, the next `header:KEY:2`, so a retried request applies none twice.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from starlette.requests import Request

from ..engine.commands import Command
from ..engine.outcomes import IDEMPOTENCY_KEY
from ..engine.writer import Writer
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
        return await self.writer.do(cmd, key=key if key is not None else f"header:{self.key}:{self.sent}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


class WriterDependency:
    """`lith.writer`: a FastAPI dependency for command routes, and the writer itself elsewhere
    (`await lith.writer.do(cmd)` in a background task; its counters), through to `writer`."""

    def __init__(self, writer: Writer, *, same_origin_only: bool = True) -> None:
        self.writer = writer
        self.same_origin_only = same_origin_only

    async def __call__(self, request: Request) -> Writer | KeyedWriter:
        """Refuse cross-site and non-Datastar requests (see origin.py); non-browser clients and
        tests turn that off (`same_origin_only=False`). Mark the request as a command's
        (`request.state.lith_command`), and key its commands by its `Idempotency-Key`, if any."""
        request.state.lith_command = True
        if self.same_origin_only:
            reason = cross_site_reason(request)
            if reason:
                raise HTTPException(403, reason)
        key = request.headers.get("idempotency-key")
        if key is None:
            return self.writer
        if not IDEMPOTENCY_KEY.fullmatch(key):
            raise HTTPException(400, "Idempotency-Key must be 1 to 200 visible ASCII characters")
        return KeyedWriter(self.writer, key)

    async def do(self, cmd: Command, *, key: str | None = None) -> Any:
        return await self.writer.do(cmd, key=key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)

    def __repr__(self) -> str:
        return f"WriterDependency({self.writer!r})"
