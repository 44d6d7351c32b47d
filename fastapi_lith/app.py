"""`Lith`: one SQLite-backed app's settings, lifespan, router and dependencies."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import htpy as h
from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from markupsafe import Markup
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from . import db
from .hub import Hub
from .views import Render, Views
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
        tick: float = 0.05,
    ) -> None:
        self.path = Path(path)
        self.error_id = error_id
        self.tick = tick
        self.views = Views()
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
        self.router = APIRouter(prefix=prefix, include_in_schema=False)
        self._hub: Hub | None = None
        self._engine: AsyncEngine | None = None

    def view(self, key: str, *, topics: set[str] | frozenset[str] | tuple[str, ...] = ()) -> Callable[[Render], Render]:
        """Register `fn(db, **params) -> HTML` as the view `key`, rendered when `topics` change.

        ```python
        @lith.view("board/{board_id}", topics={"board:{board_id}"})
        def board(db: Db, board_id: int) -> Element: ...
        ```
        """
        return self.views.register(key, topics)

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            raise RuntimeError("the app is not running: use lith.lifespan")
        return self._hub

    async def render(self, key: str, **params: Any) -> Markup:
        """A view's HTML for a page's first paint: the page and its stream share one function."""
        return Markup(await self.hub.render(key, params or None))

    async def db(self) -> AsyncIterator[AsyncConnection]:
        """`Depends(lith.db)`: an async read-only connection for ad hoc reads in a handler."""
        if self._engine is None:
            raise RuntimeError("the app is not running: use lith.lifespan")
        async with self._engine.connect() as conn:
            yield conn

    @asynccontextmanager
    async def lifespan(self, app: FastAPI | None = None, *, ticks: bool = True) -> AsyncIterator[None]:
        """Start the writer (migrating first), the readers and the hub; on exit drain and close.

        `ticks=False` leaves the hub still until `await lith.hub.tick()`, for tests.
        """
        if app is not None:
            self._install_error_handler(app)
        await self.writer.start()
        readers = db.Readers(self.path, size=self._reader_count)
        hub = self._hub = Hub(self.views, readers, tick=self.tick)
        unsubscribe = self.writer.subscribe(hub.touched)
        self._engine = read_only_engine(self.path)
        if ticks:
            hub.start()
        try:
            yield
        finally:
            await hub.stop()
            await self.writer.close()
            unsubscribe()
            readers.close()
            await self._engine.dispose()
            self._engine = None
            self._hub = None

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


def read_only_engine(path: Path) -> AsyncEngine:
    """SQLAlchemy's async engine on aiosqlite, with every connection `query_only`."""
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA query_only = ON")
        cursor.close()

    return engine


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
