"""`Lith`: one SQLite-backed app's settings, lifespan, router and dependencies."""

from __future__ import annotations

import asyncio
import inspect
import logging
import operator
import re
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.requests import Request
from starlette.responses import Response

from . import settings
from .backends import open_backend
from .backends.sqlite import db
from .backends.sqlite.writer import SqliteWriter
from .dashboard import Dashboard
from .engine import encoders
from .engine.commands import Command, _Touch
from .engine.encoders import Encoder
from .engine.engine import Engine, app_views, register_view
from .engine.feed import Feed
from .engine.hub import Hub
from .engine.readers import Readers
from .engine.streams import Principal
from .engine.views import Access, Render, Topics, Views
from .engine.writer import Writer
from .exceptions import AlreadyRunning, BadParameter, NotRunning, SettingError, WriterClosed
from .ops import Backups
from .ops.litestream import WRITER_CHECKPOINT_PAGES
from .ops.metrics import Metrics
from .ops.replica import Replica
from .web.guard import BadRequest, Messages
from .web.layer import WebLayer, WebSettings
from .web.operator import scrape_router, unguarded

log = logging.getLogger("fastapi_lith")


# The writer's settings keep the writer's defaults, written once, in engine/writer.py.
def _defaults(part: Callable[..., Any]) -> dict[str, Any]:
    """A part's own defaults, so each is written once: in the part's signature."""
    return {name: p.default for name, p in inspect.signature(part).parameters.items()}


_WRITER, _BACKUPS, _REPLICA = _defaults(SqliteWriter), _defaults(Backups), _defaults(Replica)


def _kept_by(part: str, name: str) -> Any:
    """A `Lith` attribute that is `name` of the part at the dotted path `part`."""
    holder = operator.attrgetter(part)
    return property(lambda self: getattr(holder(self), name), lambda self, value: setattr(holder(self), name, value))

class Lith:
    """A live app on one SQLite file.

    ```python
    lith = Lith("app.db", migrations=Path(__file__).parent / "migrations")
    app = FastAPI()
    app.include_router(lith.router)  # the stream route and the lifespan; command routes guarded
    lith.command(app, "/add", Add)  # POST /add: validate, apply, 204
    ```

    One engine (engine/engine.py) behind the web layer (web/layer.py).

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
        synchronous: db.Synchronous = _WRITER["synchronous"],
        readers: int | Readers = 2,
        batch_size: int = _WRITER["batch_size"],
        cached_statements: int = _WRITER["cached_statements"],
        statement_cache: bool = _WRITER["statement_cache"],
        same_origin_only: bool = WebSettings.same_origin_only,
        max_body: int = WebSettings.max_body,
        error_id: str = WebSettings.error_id,
        prefix: str = "/lith",
        tick: float = 0.05,
        keepalive: float = WebSettings.keepalive,
        hibernate_after: float = WebSettings.hibernate_after,
        send_timeout: float = WebSettings.send_timeout,
        reconnect_within: float = WebSettings.reconnect_within,
        zstd_window_log: int | None = None,
        brotli_quality: int = 4,
        gzip_level: int = 6,
        datastar_url: str = WebSettings.datastar_url,
        datastar_integrity: str | None = None,
        identity: Callable[..., Any] | None = None,
        secret: str | Sequence[str] | None = None,
        stream_max_age: float = WebSettings.stream_max_age,
        backup_folder: str | Path | None = None,
        backup_every: float = _BACKUPS["every"],
        backup_keep: int = _BACKUPS["keep"],
        repeat_window: float = _WRITER["repeat_window"],
        messages: Messages | None = None,
        outcome_hint: str = "",
        replica: str | None = None,
        replica_sync_interval: float = _REPLICA["sync_interval"],
        replica_check_every: float | None = _REPLICA["check_every"],
        feed: Feed | None = None,
        views: Views | None = None,
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
          `reconnect_within` (each stream's `retry:`, drawn from 1 s to this, spreads a deploy's
          reconnects),
          `zstd_window_log`, `brotli_quality`, `gzip_level` (replace the encoder with
          `app.dependency_overrides[lith.encoder]`);
        - command routes: `max_body`, `error_id`, `messages`, `outcome_hint`;
        - who is asking (docs/access.md): `identity` (the app's FastAPI dependency giving the
          principal's id), `secret` (signs stream tokens; a list rotates), `stream_max_age`;
        - backups: `backup_folder`, `backup_every`, `backup_keep`;
        - replica: `replica`, `replica_sync_interval`, `replica_check_every`;
        - views (`views=`, from `engine.app_views`): shared by several engines, an account pool's.
        """
        # A file is SQLite; a postgresql+psycopg:// URL is PostgreSQL (see backends/).
        self.backend = open_backend(path)
        self.path = self.backend.path  # None on PostgreSQL
        if writer is not None:
            passed = {
                "migrations": migrations, "synchronous": synchronous, "batch_size": batch_size,
                "cached_statements": cached_statements, "statement_cache": statement_cache,
                "repeat_window": repeat_window, "feed": feed,
            }  # fmt: skip
            # Each default is written once, in the signature above.
            defaults = inspect.signature(Lith.__init__).parameters
            given = [name for name, value in passed.items() if value != defaults[name].default]
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
        if isinstance(writer, SqliteWriter) and replica is not None:  # Litestream checkpoints the WAL itself
            writer.wal_autocheckpoint = WRITER_CHECKPOINT_PAGES
        tick = settings.number("tick", tick, low=0.001)
        # Every tab's outcome: the last message and the `done` signal (see commands.py).
        if not isinstance(outcome_hint, str):
            raise SettingError(f"outcome_hint must be a string, not {outcome_hint!r}")
        self.outcome_hint = outcome_hint
        if views is not None and not isinstance(views, Views):
            raise SettingError(f"views must be the Views of engine.app_views, not {views!r}")
        self.views = views if views is not None else app_views(outcome_hint)
        engine_writer = writer if writer is not None else self.backend.writer(
            migrations=migrations,
            synchronous=synchronous,
            batch_size=batch_size,
            cached_statements=cached_statements,
            statement_cache=statement_cache,
            repeat_window=repeat_window,
            wal_autocheckpoint=WRITER_CHECKPOINT_PAGES if replica is not None else _WRITER["wal_autocheckpoint"],
            feed=self.feed,
        )
        if not isinstance(readers, Readers):
            readers = settings.number("readers", readers, low=1, integer=True)
        self.engine = Engine(self.backend, engine_writer, self.feed, self.views, readers=readers, hub=hub, tick=tick)
        config = WebSettings(
            same_origin_only=same_origin_only, max_body=max_body, error_id=error_id, messages=messages,
            keepalive=keepalive, hibernate_after=hibernate_after, send_timeout=send_timeout,
            reconnect_within=reconnect_within,
            encoders=encoders.encoder_settings(
                zstd_window_log=zstd_window_log, brotli_quality=brotli_quality, gzip_level=gzip_level
            ),
            datastar_url=datastar_url, datastar_integrity=datastar_integrity,
            identity=identity, secret=secret, stream_max_age=stream_max_age,
        )
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise SettingError(f"prefix must be a path like '/lith' (a leading '/', none at the end), not {prefix!r}")
        self.prefix = prefix
        engine = self.engine

        async def current() -> Engine:
            return engine

        # The web layer holds the engine and this Lith's lifespan, not the Lith: with no cycle
        # through it, an account's Lith is freed (its engine with it) the moment its pool closes
        # it, not at CPython's next full collection.
        self.web = WebLayer(
            config, current=current, engine_of=lambda request: engine, views=self.views,
            router=APIRouter(prefix=prefix, include_in_schema=False, lifespan=_lifespan_of(self)),
            stream_path="/stream", writer=engine_writer,
        )
        # `Depends(lith.writer)`: the writer, guarded for a command's request (web/dependency.py).
        self.writer = self.web.writer
        # `Depends(lith.encoder)`, `Depends(lith.same_origin)`: the web layer's own, so that
        # `app.dependency_overrides[lith.encoder]` reaches the stream route.
        self.encoder = self.web.encoder
        self.same_origin = self.web.same_origin
        # `Depends(lith.principal)`: the request's principal, from the app's `identity`.
        self.principal = self.web.principal
        for name, value in (("migrations", migrations), ("backup_folder", backup_folder)):
            if value is not None and not isinstance(value, (str, Path)):
                raise SettingError(f"{name} must be a path or None, not {value!r}")
        if self.path is None and (backup_folder is not None or replica is not None):
            raise SettingError("backup_folder and replica copy a SQLite file: back up PostgreSQL with pg_dump")
        settings.number("backup_every", backup_every, low=1)
        settings.number("backup_keep", backup_keep, low=1, integer=True)
        # A consistent copy of the database every `backup_every` s, the newest `backup_keep` kept.
        self.backups: Backups | None = None
        # Every commit copied off the machine by Litestream (s3://bucket/path, file:///mnt/...),
        # the database restored from it when its file is missing, the copy checked daily.
        self.replica: Replica | None = None
        if self.path is not None:  # without a SQLite file both were refused above
            if backup_folder is not None:
                self.backups = Backups(self.path, backup_folder, every=backup_every, keep=backup_keep)
            if replica is not None:
                self.replica = Replica(
                    self.path, replica, sync_interval=replica_sync_interval, check_every=replica_check_every
                )
        self._later: set[asyncio.Task[None]] = set()
        self._metrics: Metrics | None = None
        self._metrics_router: APIRouter | None = None
        self._dashboard: Dashboard | None = None
        self._serving: FastAPI | None = None
        self._running = False

    # Settings kept by the part that uses them, read (and, in tests, set) through the Lith.
    tick = _kept_by("engine", "tick")
    error_id = _kept_by("web.settings", "error_id")
    max_body = _kept_by("web.settings", "max_body")
    messages = _kept_by("web.settings", "messages")
    keepalive = _kept_by("web.settings", "keepalive")
    hibernate_after = _kept_by("web.settings", "hibernate_after")
    send_timeout = _kept_by("web.settings", "send_timeout")
    reconnect_within = _kept_by("web.settings", "reconnect_within")
    encoder_settings = _kept_by("web.settings", "encoders")
    datastar_url = _kept_by("web.settings", "datastar_url")
    datastar_integrity = _kept_by("web.settings", "datastar_integrity")

    @property
    def router(self) -> APIRouter:
        """The stream route, `GET {prefix}/stream`, out of OpenAPI, and the app's lifespan:
        `app.include_router(lith.router)` is all an app needs (see web/layer.py)."""
        return self.web.router

    @property
    def metrics(self) -> Metrics:
        """This app's metrics (ops/metrics.py), made on first use: an app that never asks for
        them, or an account's `Lith`, samples nothing. Ask before the app starts, so that its
        lifespan runs the sampler (`metrics_router` does)."""
        if self._metrics is None:
            self._metrics = Metrics(lambda: (self.engine,), replica=self.replica)
        return self._metrics

    @property
    def metrics_router(self) -> APIRouter:
        """`GET {prefix}/metrics` in Prometheus's format, off until the app includes it with its
        own guard: `app.include_router(lith.metrics_router, dependencies=[Depends(operator)])`."""
        if self._metrics_router is None:
            metrics = self.metrics
            self._metrics_router = scrape_router(
                metrics.scrape, metrics.content_type, self.prefix, included_as="lith.metrics_router"
            )
        return self._metrics_router

    @property
    def dashboard_router(self) -> APIRouter:
        """`GET {prefix}/dashboard`, this app's numbers live, and its stream, off until the app
        includes it with its own guard: `app.include_router(lith.dashboard_router,
        dependencies=[Depends(operator)])`. With no dependency it is refused at start-up;
        `dependencies=[Depends(lith.unguarded)]` opens it to anyone (docs/dashboard.md)."""
        if self._dashboard is None:
            self._dashboard = Dashboard(self.metrics, self.engine, self.web, self.views, prefix=self.prefix)
        return self._dashboard.router

    # `Depends(lith.unguarded)`: the scrape or the dashboard open to anyone, on purpose.
    unguarded = staticmethod(unguarded)

    def view(self, key: str, *, topics: Topics = (), access: Access | None = None) -> Callable[[Render], Render]:
        """Register `fn(db, **params) -> HTML` as the view `key`, rendered when `topics` change.

        ```python
        @lith.view("board/{board_id}", topics={"board:{board_id}"}, access=is_member)
        def board(db: Db, board_id: int) -> Element: ...
        ```

        `access(db, principal, **params) -> bool` is asked on every stream open; a key with a
        `{principal}` parameter is private to that principal (docs/access.md).
        """
        return register_view(self.views, key, topics, access)

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
        A field marked `FromServer()` is filled by the server (see `body`).
        """
        self.web.command(app, path, command, dependencies=dependencies, max_body=max_body)

    def body(self, command: type[Command]) -> Callable[..., Any]:
        """`Depends(lith.body(Command))`: the request's body as `command`, its server fields filled.

        ```python
        class AddTask(TabCommand):
            title: str
            owner: Annotated[str, FromServer()]  # the principal, from `identity`

        @app.post("/tasks", status_code=204)
        async def add(cmd: Annotated[AddTask, Depends(lith.body(AddTask))], writer: Writer = Depends(lith.writer)):
            await writer.do(cmd)
        ```

        A field marked `FromServer(dep)` is filled from the FastAPI dependency `dep`, a bare
        `FromServer()` from `lith.principal`; the client may send the others (JSON or a form),
        and a body that sends a server field is refused, 422 naming it. The route is a command
        route: guarded as one that takes `Depends(lith.writer)`.
        """
        return self.web.body(command)

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

    @property
    def hub(self) -> Hub:
        return self.engine.hub

    def connect(self, *keys: str, tab: str) -> str:
        """The `data-init` expression that opens a tab's stream of `keys` (`{tab}` is filled in).

        `retry: 'always'` reconnects when the stream ends (a deploy) and, with no retry limit,
        whenever the network comes back. A key the stream would refuse is a `ViewError` here.
        """
        return self.web.connect(f"{self.prefix}/stream", *keys, tab=tab)

    def datastar(self) -> Markup:
        """Datastar's script and the notice shown if it cannot load: put it first in `<body>`.

        Nothing on a live page works without Datastar, so a failed load says so.
        """
        return self.web.datastar()

    async def open_stream(self, request: Request, encoder: Encoder) -> Response:
        """Validate the views and the tab id (400 with a plain message), then stream."""
        return await self.web.open_stream(self.engine, request, encoder)

    async def render(self, key: str, **params: Any) -> Markup:
        """A view's HTML for a page's first paint: the page and its stream share one function.

        A parameter the view refuses (a path parameter past SQLite's integers) answers 400.
        `{principal}` is the page's own (`Depends(lith.principal)`) unless given."""
        params = self.web.render_params(key, params)
        try:
            return Markup(await self.engine.render(key, params or None))
        except BadParameter as exc:
            raise BadRequest(str(exc)) from None

    async def revoke(self, principal: Principal) -> int:
        """End every stream opened as `principal`, at once and in every process (on logout, or
        when a member is removed); returns how many ended in this one. Each page reconnects, and
        its reconnect asks the identity and the views' access rules again."""
        if principal is None or type(principal) not in (str, int):
            raise SettingError(f"revoke takes a principal's id (a str or an int), not {principal!r}")
        return await self.engine.revoke(principal)

    async def db(self) -> AsyncIterator[AsyncConnection]:
        """`Depends(lith.db)`: an async read-only connection for ad hoc reads in a handler."""
        async with self.engine.async_engine.connect() as conn:
            yield conn

    @asynccontextmanager
    async def lifespan(self, app: FastAPI | None = None, *, ticks: bool = True) -> AsyncIterator[None]:
        """Start the engine (the writer migrating first, the readers, the hub), then backups and
        the replica; on exit stop them, the writer drained. With `app`, guard its command routes
        first (web/layer.py).

        FastAPI runs this as `lith.router`'s lifespan, inside the app's own, which may be this
        one too (`FastAPI(lifespan=lith.lifespan)`): the engine starts once, for the outer.
        `ticks=False` leaves the hub still until `await lith.hub.tick()`, for tests. One start at
        a time: a second, while the first runs, is `AlreadyRunning` and leaves it unharmed.
        """
        if app is not None and self._serving is app:  # the same app's lifespan, nested
            yield
            return
        if self._running:  # claimed before any await: two starts at once are caught too
            raise AlreadyRunning("this Lith is already running (a served app, or Tabs(lith)): stop it first")
        if app is not None:
            self.web.guard(app)
        self._running = True
        try:
            async with self._serve(app, ticks=ticks):
                yield
        finally:
            self._running = False

    @asynccontextmanager
    async def _serve(self, app: FastAPI | None, *, ticks: bool) -> AsyncIterator[None]:
        if self.replica is not None:  # binary, credentials, and a missing file restored first
            await anyio.to_thread.run_sync(self.replica.prepare)
        try:
            sampler: AbstractAsyncContextManager[None] = nullcontext()
            if self._metrics is not None:
                sampler = self._metrics.running()
            # The sampler outside the engine: its last sample counts what the engine's stop drained.
            async with sampler, self.engine.run(ticks=ticks), _traced(self.engine):  # spans, if the app traces
                self._serving = app
                if self.backups is not None:
                    await self.backups.start()  # after the writer: the database exists and is migrated
                try:
                    if self.replica is not None:  # inside: a replica that cannot start stops the rest
                        await self.replica.start()
                    yield
                finally:
                    self._serving = None
                    for task in list(self._later):
                        task.cancel()
                    if self.backups is not None:
                        await self.backups.stop()  # a copy in progress finishes first
        finally:
            if self.replica is not None:
                await self.replica.stop()  # after the writer's last commit: it is uploaded too

    def install(self, app: FastAPI) -> None:
        """A shortcut: `app.include_router(lith.router)`, and HTML errors for a Datastar request
        to any route of `app` (a page's own `@get`), not only to those that take the writer.

        ```python
        app = FastAPI()
        lith.install(app)
        ```
        """
        self.web.install(app)


@asynccontextmanager
async def _traced(engine: Engine) -> AsyncIterator[None]:
    """OpenTelemetry spans of each command's path while inside, if the app set a real
    TracerProvider (docs/tracing.md). Asked of the API the app already imported, if any: an app
    that traces nothing imports nothing more for it."""
    api = sys.modules.get("opentelemetry.trace")
    defaults = () if api is None else (api.ProxyTracerProvider, api.NoOpTracerProvider)  # none set
    provider = None if api is None else api.get_tracer_provider()
    if provider is None or isinstance(provider, defaults):
        yield
        return
    from .ops.tracing import traced

    with traced(engine, provider):
        yield


_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")


def _lifespan_of(lith: Lith) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """`lith.lifespan` for its router, holding `lith` weakly (the Lith holds the router)."""
    lifespan = weakref.WeakMethod(lith.lifespan)

    def run(app: FastAPI) -> AbstractAsyncContextManager[None]:
        bound = lifespan()
        if bound is None:
            raise NotRunning("this router's Lith is gone: keep a reference to it (lith = Lith(...)) while its app runs")
        return bound(app)

    return run
