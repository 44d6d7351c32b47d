"""`Engine`: one database's live side, with no web framework: writer, readers, hub, feed.

The web layer (web/) serves one engine (`Lith`) or a pool of them (`Accounts`) through the same
routes; everything it asks of a database goes through this object: start and stop it, render a
view for a first paint, push a frame to a tab, and tell whether it is idle (an account pool
closes idle ones).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from htpy import Element
from markupsafe import Markup
from sqlalchemy.ext.asyncio import AsyncEngine

from ..exceptions import AlreadyRunning, NotRunning
from . import outcomes
from .db import Db
from .feed import Feed
from .frames import Frame
from .hub import Hub
from .readers import Readers
from .streams import Principal
from .views import Access, Render, Topics, Views
from .writer import Writer

OUTCOME_VIEW = "outcome/{tab}"
_BUILTIN: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()  # the library's own views


class Backend(Protocol):
    """What the engine opens from its backend (backends/): the readers and the async engine of
    ad hoc reads. The writer and the feed are built by the app and handed in."""

    def readers(self, size: int) -> Any: ...

    def engine(self) -> AsyncEngine: ...


def app_views(outcome_hint: str = "") -> Views:
    """An app's views, the built-in `"outcome/{tab}"` among them: every tab's last message and
    its `done` signal (commands.py). One per app, shared by every engine of an account pool."""
    def outcome(db: Db, tab: str) -> Element | Markup:
        return outcomes.outcome_view(db, tab, hint=outcome_hint)

    views = Views()
    views.register(OUTCOME_VIEW, {"tab:{tab}"})(outcome)
    _BUILTIN.add(outcome)
    return views


def register_view(views: Views, key: str, topics: Topics, access: Access | None = None) -> Callable[[Render], Render]:
    """`@lith.view` and `@accounts.view`: the app's own `"outcome/{tab}"` replaces the built-in."""
    register = views.register(key, topics, access)  # its topics checked before anything changes
    builtin = views.get(key)
    if builtin is not None and builtin.render in _BUILTIN:
        views.drop(key)
    return register


class Engine:
    """One database's writer, readers, hub and feed, started and stopped together.

    `readers` is the app's own `Readers` (left open at stop) or how many to open; `hub` builds
    the hub, called as `hub(views, readers, tick=..., feed=...)`.
    """

    def __init__(
        self,
        backend: Backend,
        writer: Writer,
        feed: Feed,
        views: Views,
        *,
        readers: Readers | int = 2,
        hub: Callable[..., Hub] = Hub,
        tick: float = 0.05,
    ) -> None:
        self.backend = backend
        self.writer = writer
        self.feed = feed
        self.views = views
        self.tick = tick
        # The app's own Readers are not closed here; a count is opened at each start.
        self._readers: Readers | None = readers if isinstance(readers, Readers) else None
        self._reader_count = readers if isinstance(readers, int) else 0
        self._make_hub = hub
        self._hub: Hub | None = None
        self._async_engine: AsyncEngine | None = None
        self._running = False

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            raise NotRunning("the app is not running: use lith.lifespan")
        return self._hub

    @property
    def running(self) -> bool:
        return self._running

    @property
    def async_engine(self) -> AsyncEngine:
        """SQLAlchemy's async engine on the database, read-only: `Depends(lith.db)`."""
        if self._async_engine is None:
            raise NotRunning("the app is not running: use lith.lifespan")
        return self._async_engine

    @asynccontextmanager
    async def run(self, *, ticks: bool = True) -> AsyncIterator[None]:
        """Start the writer (migrating first), the feed, the readers and the hub; on exit stop
        the hub (its streams end), drain the writer, then close the rest.

        `ticks=False` leaves the hub still until `await hub.tick()`, for tests.
        """
        if self._running:  # claimed before any await: two starts at once are caught too
            raise AlreadyRunning("this Lith is already running (a served app, or Tabs(lith)): stop it first")
        self._running = True
        try:
            await self.writer.start()
            try:
                await self.feed.start(self.writer)
                readers = self._readers or self.backend.readers(self._reader_count)
                hub = self._hub = self._make_hub(self.views, readers, tick=self.tick, feed=self.feed)
                unsubscribe = self.writer.subscribe(hub.touched)
                self._async_engine = self.backend.engine()
                if ticks:
                    hub.start()
            except BaseException:
                await self.writer.close()
                raise
            try:
                yield
            finally:
                await hub.stop()
                await self.writer.close()
                await self.feed.close()
                unsubscribe()
                if readers is not self._readers:
                    readers.close()
                await self._async_engine.dispose()
                self._async_engine = None
                self._hub = None
        finally:
            self._running = False

    async def render(self, key: str, params: dict[str, Any] | None = None) -> str:
        """A view's HTML for a page's first paint, from the same function its stream renders."""
        return await self.hub.render(key, params)

    def push(self, tab: str, frame: Frame) -> None:
        """Send `frame` to every stream of `tab` (a refused command's error); none if stopped."""
        if self._hub is not None:
            self._hub.push(tab, frame)

    async def revoke(self, principal: Principal) -> int:
        """End every stream opened as `principal`, in every process; how many ended here."""
        return await self.hub.revoke(principal)

    def is_idle(self) -> bool:
        """No stream open and no command waiting: nothing would notice it stopping (a command a
        background task queued would still commit, but later than it could)."""
        return (self._hub is None or not self._hub.streams) and not self.writer.queued
