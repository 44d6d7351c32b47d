"""`Lith`: one SQLite-backed app's settings, lifespan, router and dependencies."""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from markupsafe import Markup
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from . import db, encoders, settings
from .encoders import Encoder
from .exceptions import LithError, NotRunning, SettingError, ViewError
from .guard import (
    BodyLimit,
    Messages,
    acting_tab,
    http_error_fragment,
    is_command_request,
    received_body,
    validation_fragment,
)
from .feed import Feed, SqliteFeed
from .hub import Hub
from .ops import Backups
from .ops.litestream import WRITER_CHECKPOINT_PAGES
from .ops.replica import Replica
from .streams import TAB_ID, Frame, Stream, StreamResponse, body
from .views import Render, Views
from .writer import Writer

log = logging.getLogger("fastapi_lith")

DATASTAR_CDN = "https://cdn.jsdelivr.net/gh/starfederation/datastar@1.0.1/bundles/datastar.js"


class Lith:
    """A live app on one SQLite file.

    ```python
    lith = Lith("app.db", migrations="migrations/")
    app = FastAPI(lifespan=lith.lifespan)
    lith.install(app)

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
        zstd_window_log: int | None = None,
        brotli_quality: int = 4,
        gzip_level: int = 6,
        datastar_url: str = DATASTAR_CDN,
        backup_folder: str | Path | None = None,
        backup_every: float = 3600.0,
        backup_keep: int = 24,
        repeat_window: float = 3600.0,
        messages: Messages | None = None,
        replica: str | None = None,
        replica_sync_interval: float = 1.0,
        replica_check_every: float | None = 86400.0,
        feed: Feed | None = None,
    ) -> None:
        """Every setting is checked here: a typo raises `SettingError` (a `ValueError`)."""
        self.path = Path(path)
        # Any number of processes may serve one file (`--workers N`): by default every batch
        # writes its topics to a table that every process's hub polls. See feed.py.
        self.feed = feed if feed is not None else SqliteFeed(self.path)
        if not isinstance(error_id, str) or not _HTML_ID.fullmatch(error_id):
            raise SettingError(f"error_id must be an HTML id (a letter, then letters, digits, '-' or '_'), not {error_id!r}")
        self.error_id = error_id
        self.tick = settings.number("tick", tick, low=0.001)
        self.views = Views()
        self.writer = Writer(
            self.path,
            migrations=migrations,
            synchronous=synchronous,
            batch_size=batch_size,
            statement_cache=statement_cache,
            same_origin_only=same_origin_only,
            repeat_window=repeat_window,
            wal_autocheckpoint=WRITER_CHECKPOINT_PAGES if replica is not None else 1000,
            feed=self.feed,
        )
        self._reader_count = settings.number("readers", readers, low=1, integer=True)
        self.max_body = settings.number("max_body", max_body, low=1, integer=True)
        self.keepalive = settings.number("keepalive", keepalive, low=0.001)
        self.hibernate_after = settings.number("hibernate_after", hibernate_after, low=0.001)
        self.send_timeout = settings.number("send_timeout", send_timeout, low=0.001)
        # None sizes each stream's window from its first write; browsers refuse one over 8 MiB.
        if zstd_window_log is not None:
            settings.number("zstd_window_log", zstd_window_log, low=10, high=23, integer=True)
        settings.number("brotli_quality", brotli_quality, low=0, high=11, integer=True)
        settings.number("gzip_level", gzip_level, low=0, high=9, integer=True)
        self.encoder_settings = {
            "zstd": {"window_log": zstd_window_log},
            "br": {"quality": brotli_quality},
            "gzip": {"level": gzip_level},
        }
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise SettingError(f"prefix must be a path like '/lith' (a leading '/', none at the end), not {prefix!r}")
        self.prefix = prefix
        if not isinstance(datastar_url, str) or not datastar_url:
            raise SettingError(f"datastar_url must be a URL or a path, not {datastar_url!r}")
        self.datastar_url = datastar_url
        if messages is not None and not callable(messages):
            raise SettingError(f"messages must be a function (pydantic error -> message or None), not {messages!r}")
        self.messages = messages
        for name, value in (("migrations", migrations), ("backup_folder", backup_folder)):
            if value is not None and not isinstance(value, (str, Path)):
                raise SettingError(f"{name} must be a path or None, not {value!r}")
        settings.number("backup_every", backup_every, low=1)
        settings.number("backup_keep", backup_keep, low=1, integer=True)
        # A consistent copy of the database every `backup_every` s, the newest `backup_keep` kept.
        self.backups = (
            Backups(self.path, backup_folder, every=backup_every, keep=backup_keep)
            if backup_folder is not None
            else None
        )
        # Every commit copied off the machine by Litestream (s3://bucket/path, file:///mnt/...),
        # the database restored from it when its file is missing, the copy checked daily.
        self.replica = (
            Replica(self.path, replica, sync_interval=replica_sync_interval, check_every=replica_check_every)
            if replica is not None
            else None
        )
        self._router: APIRouter | None = None
        self._hub: Hub | None = None
        self._engine: AsyncEngine | None = None
        self._installed: weakref.WeakSet[FastAPI] = weakref.WeakSet()

    @property
    def router(self) -> APIRouter:
        """The stream route, `GET {prefix}/stream`; built on first use, as `Accounts` serves
        many `Lith`s through one route of its own and never needs theirs."""
        if self._router is None:
            self._router = APIRouter(prefix=self.prefix, include_in_schema=False)
            self._router.add_api_route("/stream", self._stream_endpoint(), methods=["GET"])
        return self._router

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
            raise NotRunning("the app is not running: use lith.lifespan")
        return self._hub

    def connect(self, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` (`{tab}` is filled in).

        `retry: 'always'` reconnects when the stream ends (a deploy) and, with no retry limit,
        whenever the network comes back.
        """
        if not TAB_ID.fullmatch(tab):
            raise ViewError(f"bad tab id {tab!r}: 1 to 64 letters, digits, '-' or '_'")
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
        return StreamResponse(
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
            raise NotRunning("the app is not running: use lith.lifespan")
        async with self._engine.connect() as conn:
            yield conn

    @asynccontextmanager
    async def lifespan(self, app: FastAPI | None = None, *, ticks: bool = True) -> AsyncIterator[None]:
        """Start the writer (migrating first), the readers and the hub; on exit drain and close.

        `ticks=False` leaves the hub still until `await lith.hub.tick()`, for tests.
        """
        if app is not None and app not in self._installed:
            raise LithError(
                "lith.install(app) was not called: without it the stream route, the body limit "
                "on command routes and the HTML error answers are missing. Call it right after "
                "app = FastAPI(lifespan=...)."
            )
        if self.replica is not None:  # binary, credentials, and a missing file restored first
            await anyio.to_thread.run_sync(self.replica.prepare)
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
            if self.replica is not None:  # inside: a replica that cannot start stops the rest
                await self.replica.start()
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
            if self.replica is not None:
                await self.replica.stop()  # after the writer's last commit: it is uploaded too

    def install(self, app: FastAPI) -> None:
        """Add what the library needs to `app`, once, before it starts.

        ```python
        app = FastAPI(lifespan=lith.lifespan)
        lith.install(app)
        ```

        - the stream route, `GET {prefix}/stream`, out of OpenAPI;
        - `BodyLimit`, a middleware that stops the body of every route taking
          `Depends(lith.writer)` at `max_body` bytes (see `guard.py` for why a middleware);
        - handlers for `RequestValidationError` and `HTTPException`: on a command request (one
          Datastar sent, or one the writer dependency marked) a 4xx answer becomes an HTML
          fragment, pushed to the acting tab with `done` set. Other requests get the app's
          handlers as they were when this was called (FastAPI's own by default).
        """
        app.include_router(self.router)
        app.add_middleware(BodyLimit, writer=self.writer, max_body=self.max_body)
        validation_fallback = app.exception_handlers.get(RequestValidationError, request_validation_exception_handler)
        http_fallback = app.exception_handlers.get(StarletteHTTPException, http_exception_handler)

        async def on_validation_error(request: Request, exc: Exception) -> Response:
            if isinstance(exc, RequestValidationError) and is_command_request(request):
                html = validation_fragment(exc, self.error_id, self.messages)
                self._push_error(received_body(request, exc), html)
                return HTMLResponse(html, status_code=422)
            return await validation_fallback(request, exc)  # type: ignore[misc]

        async def on_http_error(request: Request, exc: Exception) -> Response:
            if (
                isinstance(exc, StarletteHTTPException)
                and 400 <= exc.status_code < 500
                and is_command_request(request)
            ):
                html = http_error_fragment(exc, self.error_id)
                self._push_error(received_body(request, exc), html)
                return HTMLResponse(html, status_code=exc.status_code, headers=exc.headers)
            return await http_fallback(request, exc)  # type: ignore[misc]

        app.add_exception_handler(RequestValidationError, on_validation_error)
        app.add_exception_handler(StarletteHTTPException, on_http_error)
        self._installed.add(app)

    def _push_error(self, body: Any, html: str) -> None:
        if self._hub is None:
            return
        tab, op = acting_tab(body)
        if tab is None:
            return
        self._hub.push(tab, Frame.patch(self.error_id, html, {"done": op} if op is not None else None))


_HTML_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")


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
