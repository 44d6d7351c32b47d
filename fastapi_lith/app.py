"""`Lith`: one SQLite-backed app's settings, lifespan, router and dependencies."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import htpy as h
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from fastapi.exceptions import RequestValidationError
from markupsafe import Markup
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from . import db, encoders
from .backup import Backups
from .encoders import Encoder
from .feed import Feed, SqliteFeed
from .hub import Hub
from .streams import TAB_ID, Frame, Stream, body
from .views import Render, ViewError, Views
from .writer import Writer

log = logging.getLogger("fastapi_lith")

DATASTAR_CDN = "https://cdn.jsdelivr.net/gh/starfederation/datastar@1.0.1/bundles/datastar.js"


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
        keepalive: float = 15.0,
        hibernate_after: float = 30.0,
        send_timeout: float = 10.0,
        zstd_window_log: int = 19,
        brotli_quality: int = 4,
        gzip_level: int = 6,
        datastar_url: str = DATASTAR_CDN,
        backup_folder: str | Path | None = None,
        backup_every: float = 3600.0,
        backup_keep: int = 24,
        feed: Feed | None = None,
    ) -> None:
        self.path = Path(path)
        # Any number of processes may serve one file (`--workers N`): by default every batch
        # writes its topics to a table that every process's hub polls. See feed.py.
        self.feed = feed if feed is not None else SqliteFeed(self.path)
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
            feed=self.feed,
        )
        self._reader_count = readers
        self.keepalive = keepalive
        self.hibernate_after = hibernate_after
        self.send_timeout = send_timeout
        if not 10 <= zstd_window_log <= 23:  # browsers refuse a zstd window over 8 MiB
            raise ValueError(f"zstd_window_log must be 10 to 23, not {zstd_window_log}")
        self.encoder_settings = {
            "zstd": {"window_log": zstd_window_log},
            "br": {"quality": brotli_quality},
            "gzip": {"level": gzip_level},
        }
        self.prefix = prefix
        self.datastar_url = datastar_url
        # A consistent copy of the database every `backup_every` s, the newest `backup_keep` kept.
        self.backups = (
            Backups(self.path, backup_folder, every=backup_every, keep=backup_keep)
            if backup_folder is not None
            else None
        )
        self.router = APIRouter(prefix=prefix, include_in_schema=False)
        self.router.add_api_route("/stream", self._stream_endpoint(), methods=["GET"])
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

    def connect(self, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` (`{tab}` is filled in).

        `retry: 'always'` reconnects when the stream ends (a deploy) and, with no retry limit,
        whenever the network comes back.
        """
        if not TAB_ID.fullmatch(tab):
            raise ValueError(f"bad tab id {tab!r}")
        views = ",".join(quote(k.format(tab=tab), safe="/{}") for k in keys)
        url = f"{self.prefix}/stream?views={views}&tab={tab}"
        # The stream needs no signals: without the filter every reconnect would carry the
        # page's form drafts in its query string.
        return f"@get('{url}', {{retry: 'always', retryMaxCount: Infinity, filterSignals: {{include: /^$/}}}})"

    async def encoder(self, accept_encoding: str | None = Header(None)) -> Encoder:
        """`Depends(lith.encoder)`: the stream's compressor, from `Accept-Encoding`.

        zstd, else brotli, else gzip, else identity, honouring q-values. Override it to force
        or forbid one: `app.dependency_overrides[lith.encoder] = lambda: GzipEncoder()`.
        Async, so FastAPI calls it on the loop instead of a thread pool.
        """
        name = encoders.negotiate(accept_encoding)
        if name is None:
            raise HTTPException(406, "no acceptable Content-Encoding (zstd, br, gzip, identity)")
        return encoders.make_encoder(name, **self.encoder_settings.get(name, {}))

    def _stream_endpoint(self) -> Callable[..., Any]:
        async def stream(request: Request, encoder: Encoder = Depends(self.encoder)) -> Response:
            """`GET {prefix}/stream?views=counter,outcome/{tab}&tab=…`: one SSE response per tab."""
            return await self.open_stream(request, encoder)

        return stream

    async def open_stream(self, request: Request, encoder: Encoder) -> Response:
        """Validate the views and the tab id (400 with a plain message), then stream."""
        tab = request.query_params.get("tab", "")
        if not TAB_ID.fullmatch(tab):
            return PlainTextResponse("tab must be 1 to 64 letters, digits, '-' or '_'", 400)
        keys = [k for v in request.query_params.getlist("views") for k in v.split(",") if k]
        if not keys:
            return PlainTextResponse("views is required: ?views=key1,key2&tab=…", 400)
        stream = Stream(tab)
        try:
            await self.hub.open(stream, keys)
        except ViewError as exc:
            return PlainTextResponse(str(exc), 400)
        shutdown = anyio.Event()
        headers = {"Vary": "Accept-Encoding"}
        if encoder.name:
            headers["Content-Encoding"] = encoder.name
        return EventSourceResponse(
            self._body(stream, encoder, shutdown),
            headers=headers,
            ping=0,  # a raw ping would corrupt a compressed body: keep-alives go through the encoder
            send_timeout=self.send_timeout,
            shutdown_event=shutdown,
            shutdown_grace_period=1.0,
        )

    async def _body(self, stream: Stream, encoder: Encoder, shutdown: anyio.Event) -> AsyncIterator[bytes]:
        # Server shutdown (sse-starlette sees uvicorn's signal) ends the body cleanly, so the
        # page's `retry: 'always'` reconnects to the next process.
        watcher = asyncio.ensure_future(shutdown.wait())
        watcher.add_done_callback(lambda _: stream.end())
        try:
            async for chunk in body(
                stream, encoder, keepalive=self.keepalive, hibernate_after=self.hibernate_after
            ):
                yield chunk
        finally:
            watcher.cancel()
            if self._hub is not None:
                self._hub.close(stream)

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
        await self.feed.start(self.writer)
        readers = db.Readers(self.path, size=self._reader_count)
        hub = self._hub = Hub(self.views, readers, tick=self.tick, feed=self.feed)
        unsubscribe = self.writer.subscribe(hub.touched)
        self._engine = read_only_engine(self.path)
        if ticks:
            hub.start()
        if self.backups is not None:
            await self.backups.start()  # after the writer: the database exists and is migrated
        try:
            yield
        finally:
            if self.backups is not None:
                await self.backups.stop()  # a copy in progress finishes first
            await hub.stop()
            await self.writer.close()
            await self.feed.close()
            unsubscribe()
            readers.close()
            await self._engine.dispose()
            self._engine = None
            self._hub = None

    def _install_error_handler(self, app: FastAPI) -> None:
        """Answer a command's validation failure with an HTML fragment, not FastAPI's JSON.

        Datastar ignores the body of a non-200 response, so the fragment also goes to the
        acting tab's stream, named by the command's `tab` signal; its `op` signal, if any,
        comes back as `done`, so a button pending on `$op != $done` stops. Other routes keep
        the app's own handler. The lifespan runs after Starlette built its middleware stack,
        so the stack is dropped and rebuilt on the next request.
        """
        fallback = app.exception_handlers.get(RequestValidationError)

        async def handler(request: Request, exc: Exception) -> Response:
            if isinstance(exc, RequestValidationError) and is_command_request(request, self.writer):
                html = validation_fragment(exc, self.error_id)
                self._push_error(exc.body, html)
                return HTMLResponse(html, status_code=422)
            if fallback is None:
                raise exc
            return await fallback(request, exc)  # type: ignore[misc]

        app.add_exception_handler(RequestValidationError, handler)
        app.middleware_stack = None

    def _push_error(self, body: Any, html: str) -> None:
        if self._hub is None or not isinstance(body, dict):
            return
        tab = body.get("tab")
        if not isinstance(tab, str) or not TAB_ID.fullmatch(tab):
            return
        op = body.get("op")
        signals = {"done": op} if isinstance(op, int) else None
        self._hub.push(tab, Frame.patch(self.error_id, html, signals))


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
