"""`Lith`: one SQLite-backed app's settings, lifespan, router and dependencies."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import htpy as h
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from . import db
from .writer import Writer

log = logging.getLogger("fastapi_lith")


class Lith:
    """A live app on one SQLite file.

    ```python
    lith = Lith("app.db", migrations="migrations/")
    app = FastAPI(lifespan=lith.lifespan)
    app.include_router(lith.router)

    @app.post("/add", status_code=204, include_in_schema=False)
    async def add(cmd: Add, writer: Writer = Depends(lith.writer)) -> None:
        await writer.do(cmd)
    ```
    """

    def __init__(
        self,
        path: str | Path,
        *,
        migrations: str | Path | None = None,
        synchronous: db.Synchronous = "NORMAL",
        readers: int = 2,
        batch_size: int = 512,
        statement_cache: bool = True,
        same_origin_only: bool = True,
        max_body: int = 64 * 1024,
        error_id: str = "lith-error",
        prefix: str = "/lith",
    ) -> None:
        self.path = Path(path)
        self.error_id = error_id
        self.writer = Writer(
            self.path,
            migrations=migrations,
            synchronous=synchronous,
            batch_size=batch_size,
            statement_cache=statement_cache,
            same_origin_only=same_origin_only,
            max_body=max_body,
        )
        self._reader_count = readers
        self.readers: db.Readers | None = None
        self.router = APIRouter(prefix=prefix, include_in_schema=False)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI | None = None) -> AsyncIterator[None]:
        """Start the writer (migrating first) and the readers; on exit drain and close them."""
        if app is not None:
            self._install_error_handler(app)
        await self.writer.start()
        self.readers = db.Readers(self.path, size=self._reader_count)
        try:
            yield
        finally:
            await self.writer.close()
            self.readers.close()
            self.readers = None

    def _install_error_handler(self, app: FastAPI) -> None:
        """Answer a command's validation failure with an HTML fragment, not FastAPI's JSON.

        Other routes keep the app's own handler. The lifespan runs after Starlette has built its
        middleware stack, so the stack is dropped and rebuilt on the next request.
        """
        fallback = app.exception_handlers.get(RequestValidationError)

        async def handler(request: Request, exc: Exception) -> Response:
            if isinstance(exc, RequestValidationError) and is_command_request(request, self.writer):
                return HTMLResponse(validation_fragment(exc, self.error_id), status_code=422)
            if fallback is None:
                raise exc
            return await fallback(request, exc)  # type: ignore[misc]

        app.add_exception_handler(RequestValidationError, handler)
        app.middleware_stack = None


def is_command_request(request: Request, writer: Writer) -> bool:
    """A request to a route that takes the writer, or one Datastar sent."""
    if request.headers.get("datastar-request") == "true":
        return True
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    stack = [dependant] if dependant is not None else []
    while stack:
        dep = stack.pop()
        if dep.call is writer:
            return True
        stack.extend(dep.dependencies)
    return False


def validation_fragment(exc: RequestValidationError, element_id: str) -> str:
    """A short, escaped list of what was wrong, with an id Datastar can patch by."""
    items = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ()) if part not in ("body", "query", "path")]
        field = ".".join(loc)
        items.append(h.li[h.strong[field], ": ", error.get("msg", "invalid")] if field else h.li[error.get("msg")])
    return str(h.div(id=element_id, role="alert", class_="lith-error")[h.ul[items]])
