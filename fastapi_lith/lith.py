"""`Lith`: one SQLite-backed app's settings, lifespan, router and dependencies."""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import htpy as h
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from .engine import encoders, outcomes
from .backends.sqlite import db
from .engine.readers import Readers
from . import settings
from .engine.commands import TAB_ID, Command, _Touch
from .engine.db import Db
from .engine.encoders import Encoder
from .backends import open_backend
from .exceptions import AlreadyRunning, LithError, NotRunning, SettingError, ViewError, WriterClosed
from .engine.feed import Feed
from .web.guard import BodyLimit, Messages, add_error_handlers, add_storage_error_handler, command_endpoint
from .engine.hub import Hub
from .ops import Backups
from .ops.litestream import WRITER_CHECKPOINT_PAGES
from .ops.replica import Replica
from .web.origin import same_origin_reason
from .engine.frames import Frame
from .web.page import DATASTAR_CDN, DATASTAR_NOTICE
from .web.sse import stream_response
from .engine.views import Render, Topics, Views
from .engine.writer import Writer
from .web.dependency import WriterDependency

log = logging.getLogger("fastapi_lith")

class Lith:
    """A live app on one SQLite file.

    ```python
    lith = Lith("app.db", migrations=Path(__file__).parent / "migrations")
    app = FastAPI(lifespan=lith.lifespan)
    lith.install(app)
    lith.command(app, "/add", Add)  # POST /add: validate, apply, 204
    ```

    Name the migrations folder from the app's file: a relative `"migrations/"` follows the
    working directory, so the app would not start from any other folder.
    """

    @settings.checked()
    def __init__(
        self,
        path: str | Path,
        *,
        writer: Writer | None = None,
        hub: Callable[..., Hub] = Hub,
        migrations: str | Path | None = None,
        synchronous: db.Synchronous = "NORMAL",
        readers: int | Readers = 2,
        batch_size: int = 512,
        cached_statements: int = 512,
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
        datastar_integrity: str | None = None,
        backup_folder: str | Path | None = None,
        backup_every: float = 3600.0,
        backup_keep: int = 24,
        repeat_window: float = 3600.0,
        messages: Messages | None = None,
        outcome_hint: str = "",
        replica: str | None = None,
        replica_sync_interval: float = 1.0,
        replica_check_every: float | None = 86400.0,
        feed: Feed | None = None,
    ) -> None:
        """Every setting is checked here: a typo raises `SettingError` (a `ValueError`).

        The settings, by part. Each part is built from its settings unless the app passes its
        own (then its settings belong to that object, and passing both is an error):

        - writer (`writer=Writer(...)`): `migrations`, `synchronous`, `batch_size`,
          `cached_statements`, `statement_cache`, `repeat_window`, `feed`;
        - the writer dependency (`Depends(lith.writer)`): `same_origin_only`;
        - readers (`readers=Readers(...)`, or how many): the hub's render threads;
        - hub (`hub=`, called as `hub(views, readers, tick=..., feed=...)`): `tick`;
        - streams and encoders: `prefix`, `keepalive`, `hibernate_after`, `send_timeout`,
          `zstd_window_log`, `brotli_quality`, `gzip_level` (replace the encoder with
          `app.dependency_overrides[lith.encoder]`);
        - command routes: `max_body`, `error_id`, `messages`, `outcome_hint`;
        - backups: `backup_folder`, `backup_every`, `backup_keep`;
        - replica: `replica`, `replica_sync_interval`, `replica_check_every`.
        """
        # A file is SQLite; a postgresql+psycopg:// URL is PostgreSQL (see backends/).
        self.backend = open_backend(path)
        self.path = self.backend.path  # None on PostgreSQL
        if writer is not None:
            given = [name for name, value, default in (
                ("migrations", migrations, None), ("synchronous", synchronous, "NORMAL"),
                ("batch_size", batch_size, 512), ("cached_statements", cached_statements, 512),
                ("statement_cache", statement_cache, True),
                ("repeat_window", repeat_window, 3600.0), ("feed", feed, None),
            ) if value != default]  # fmt: skip
            if given:
                raise SettingError(f"{', '.join(given)}: set on the Writer passed as writer=, not on Lith")
            if not isinstance(writer, Writer) or writer.path != self.path:
                raise SettingError(f"writer must be a Writer of {self.path}, not {writer!r}")
        # Any number of processes may serve one database (`--workers N`, several hosts on
        # PostgreSQL): by default every batch publishes its topics to a feed that every
        # process's hub hears (a table on SQLite, NOTIFY on PostgreSQL). See feed.py.
        self.feed = writer.feed if writer is not None else feed if feed is not None else self.backend.feed()
        if not callable(hub):
            raise SettingError(f"hub must be Hub or a function that builds one, not {hub!r}")
        self._make_hub = hub
        if writer is not None and replica is not None:  # Litestream checkpoints the WAL itself
            writer.wal_autocheckpoint = WRITER_CHECKPOINT_PAGES
        if not isinstance(error_id, str) or not _HTML_ID.fullmatch(error_id):
            raise SettingError(f"error_id must be an HTML id (a letter, then letters, digits, '-' or '_'), not {error_id!r}")
        self.error_id = error_id
        self.tick = settings.number("tick", tick, low=0.001)
        self.views = Views()
        # Every tab's outcome: the last message and the `done` signal (see commands.py).
        if not isinstance(outcome_hint, str):
            raise SettingError(f"outcome_hint must be a string, not {outcome_hint!r}")
        self.outcome_hint = outcome_hint
        self.views.register("outcome/{tab}", {"tab:{tab}"})(self._outcome_view)
        engine_writer = writer if writer is not None else self.backend.writer(
            migrations=migrations,
            synchronous=synchronous,
            batch_size=batch_size,
            cached_statements=cached_statements,
            statement_cache=statement_cache,
            repeat_window=repeat_window,
            wal_autocheckpoint=WRITER_CHECKPOINT_PAGES if replica is not None else 1000,
            feed=self.feed,
        )
        # `Depends(lith.writer)`: the writer, guarded for a command's request (web/dependency.py).
        self.writer = WriterDependency(
            engine_writer, same_origin_only=settings.flag("same_origin_only", same_origin_only)
        )
        self._readers = readers if isinstance(readers, Readers) else None  # the app's: not closed here
        self._reader_count = 0 if self._readers else settings.number("readers", readers, low=1, integer=True)
        self.max_body = settings.number("max_body", max_body, low=1, integer=True)
        self.keepalive = settings.number("keepalive", keepalive, low=0.001)
        self.hibernate_after = settings.number("hibernate_after", hibernate_after, low=0.001)
        self.send_timeout = settings.number("send_timeout", send_timeout, low=0.001)
        self.encoder_settings = encoders.encoder_settings(
            zstd_window_log=zstd_window_log, brotli_quality=brotli_quality, gzip_level=gzip_level
        )
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise SettingError(f"prefix must be a path like '/lith' (a leading '/', none at the end), not {prefix!r}")
        self.prefix = prefix
        if not isinstance(datastar_url, str) or not datastar_url:
            raise SettingError(f"datastar_url must be a URL or a path, not {datastar_url!r}")
        self.datastar_url = datastar_url
        # Subresource Integrity: the browser runs the script only if its bytes have this hash.
        if datastar_integrity is not None and not (
            isinstance(datastar_integrity, str) and _INTEGRITY.fullmatch(datastar_integrity)
        ):
            raise SettingError(f"datastar_integrity must be like 'sha384-<base64>', not {datastar_integrity!r}")
        self.datastar_integrity = datastar_integrity
        if messages is not None and not callable(messages):
            raise SettingError(f"messages must be a function (pydantic error -> message or None), not {messages!r}")
        self.messages = messages
        for name, value in (("migrations", migrations), ("backup_folder", backup_folder)):
            if value is not None and not isinstance(value, (str, Path)):
                raise SettingError(f"{name} must be a path or None, not {value!r}")
        if self.path is None and (backup_folder is not None or replica is not None):
            raise SettingError("backup_folder and replica copy a SQLite file: back up PostgreSQL with pg_dump")
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
        self._later: set[asyncio.Task[None]] = set()
        self._running = False

    @property
    def router(self) -> APIRouter:
        """The stream route, `GET {prefix}/stream`; built on first use, as `Accounts` serves
        many `Lith`s through one route of its own and never needs theirs."""
        if self._router is None:
            self._router = APIRouter(prefix=self.prefix, include_in_schema=False)
            self._router.add_api_route("/stream", self._stream_endpoint(), methods=["GET"])
        return self._router

    def view(self, key: str, *, topics: Topics = ()) -> Callable[[Render], Render]:
        """Register `fn(db, **params) -> HTML` as the view `key`, rendered when `topics` change.

        ```python
        @lith.view("board/{board_id}", topics={"board:{board_id}"})
        def board(db: Db, board_id: int) -> Element: ...
        ```
        """
        register = self.views.register(key, topics)  # its topics checked before anything changes
        builtin = self.views.get(key)
        if builtin is not None and builtin.render == self._outcome_view:
            self.views.drop(key)  # the app's own outcome view replaces the built-in one
        return register

    def _outcome_view(self, db: Db, tab: str) -> h.Element:
        return outcomes.outcome_view(db, tab, hint=self.outcome_hint)

    def command(
        self, app: FastAPI | APIRouter, path: str, command: type[Command], *,
        dependencies: Sequence[Any] = (), max_body: int | None = None,
    ) -> None:
        """`POST path`: the body validated as `command`, applied by the writer, answered 204.

        ```python
        lith.command(app, "/cards/move", MoveCard)
        lith.command(router, "/admin/purge", Purge, dependencies=[Depends(admin)])
        ```

        A normal FastAPI route, out of OpenAPI, guarded like any taking `Depends(lith.writer)`,
        with `max_body` as its own body limit (`MaxBody`) if given. A `Rejected` tab command
        answers 204 (its outcome view says why); another command's `Rejected`, 409 and why.
        """
        endpoint = command_endpoint(self.writer, command, max_body)
        app.add_api_route(
            path, endpoint, methods=["POST"], status_code=204, include_in_schema=False,
            response_model=None, dependencies=list(dependencies) or None,
        )

    def touch_later(self, delay: float, *topics: str) -> None:
        """Mark `topics` changed in `delay` seconds, in every process: a view that depends on the
        time (who is still here) re-renders when that time comes. Dropped at shutdown."""
        settings.topic_names("touch_later", topics)  # now, not in a task nobody awaits
        async def touch() -> None:
            await asyncio.sleep(delay)
            with suppress(WriterClosed):  # shutting down: the next start renders afresh anyway
                await self.writer.do(_Touch(topics=list(topics)))

        task = asyncio.create_task(touch())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def same_origin(self, request: Request) -> None:
        """`Depends(lith.same_origin)`: refuse a cross-site request (403) on a route that cannot
        take the writer's guard, such as a `navigator.sendBeacon` (it cannot send
        `Datastar-Request`). Off with `same_origin_only=False`, like the writer's."""
        if self.writer.same_origin_only:
            reason = same_origin_reason(request)
            if reason:
                raise HTTPException(403, reason)

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            raise NotRunning("the app is not running: use lith.lifespan")
        return self._hub

    def connect(self, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` (`{tab}` is filled in).

        `retry: 'always'` reconnects when the stream ends (a deploy) and, with no retry limit,
        whenever the network comes back. A key the stream would refuse is a `ViewError` here.
        """
        if not TAB_ID.fullmatch(tab):
            raise ViewError(f"bad tab id {tab!r}: 1 to 64 letters, digits, '-' or '_'")
        keys = tuple(k.format(tab=tab) for k in keys)
        self.views.for_tab(tab, keys)
        views = ",".join(quote(k, safe="/{}") for k in keys)
        url = f"{self.prefix}/stream?views={views}&tab={tab}"
        # The stream needs no signals: without the filter every reconnect would carry the
        # page's form drafts in its query string.
        return f"@get('{url}', {{retry: 'always', retryMaxCount: Infinity, filterSignals: {{include: /^$/}}}})"

    def datastar(self) -> Markup:
        """Datastar's script and the notice shown if it cannot load: put it first in `<body>`.

        Nothing on a live page works without Datastar, so a failed load says so.
        """
        return Markup(h.fragment[
            h.p("#no-datastar", role="alert", hidden=True)["Datastar did not load: reload to try again."],
            h.script(
                type="module", src=self.datastar_url, onerror=DATASTAR_NOTICE,
                integrity=self.datastar_integrity,
                crossorigin="anonymous" if self.datastar_integrity else None,
            ),
        ])

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
        return await stream_response(
            self.hub.open, request, encoder,
            keepalive=self.keepalive, hibernate_after=self.hibernate_after, send_timeout=self.send_timeout,
        )

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

        `ticks=False` leaves the hub still until `await lith.hub.tick()`, for tests. One start
        at a time: a second, while the first runs, is `AlreadyRunning` and leaves it unharmed.
        """
        if self._running:  # claimed before any await: two starts at once are caught too
            raise AlreadyRunning("this Lith is already running (a served app, or Tabs(lith)): stop it first")
        self._running = True
        try:
            async with self._serve(app, ticks=ticks):
                yield
        finally:
            self._running = False

    @asynccontextmanager
    async def _serve(self, app: FastAPI | None, *, ticks: bool) -> AsyncIterator[None]:
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
        readers = self._readers or self.backend.readers(self._reader_count)
        hub = self._hub = self._make_hub(self.views, readers, tick=self.tick, feed=self.feed)
        unsubscribe = self.writer.subscribe(hub.touched)
        self._engine = self.backend.engine()
        if ticks:
            hub.start()
        if self.backups is not None:
            await self.backups.start()  # after the writer: the database exists and is migrated
        try:
            if self.replica is not None:  # inside: a replica that cannot start stops the rest
                await self.replica.start()
            yield
        finally:
            for task in list(self._later):
                task.cancel()
            if self.backups is not None:
                await self.backups.stop()  # a copy in progress finishes first
            await hub.stop()
            await self.writer.close()
            await self.feed.close()
            unsubscribe()
            if readers is not self._readers:
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
        - handlers that answer a refused command (and a full disk's 503) as HTML, also pushed
          to the acting tab with `done` set; other requests keep the app's handlers (guard.py).
        """
        app.include_router(self.router)
        app.add_middleware(BodyLimit, writer=self.writer, max_body=self.max_body)
        add_error_handlers(app, error_id=self.error_id, messages=self.messages, push=self._push)
        add_storage_error_handler(app, error_id=self.error_id, push=self._push)
        self._installed.add(app)

    def _push(self, request: Request, tab: str, frame: Frame) -> None:
        if self._hub is not None:
            self._hub.push(tab, frame)


_INTEGRITY = re.compile(r"(sha256|sha384|sha512)-[A-Za-z0-9+/]+={0,2}( (sha256|sha384|sha512)-[A-Za-z0-9+/]+={0,2})*")
_HTML_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")
