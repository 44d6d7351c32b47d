"""The change feed: how every process's hub hears of every process's commits.

In one process the writer tells its own hub after each commit, and nothing more is needed
(`LocalFeed`). With several processes on one database (`uvicorn --workers N`, or two services on
one database) each has its own writer and hub, so each batch also writes its topics to the feed
inside its own transaction: they exist exactly when the batch does, survive what it survives,
and vanish with a rollback. Every hub asks the feed at each tick what other processes committed,
and at once when the feed can tell it something arrived (`Feed.on_arrival`): a commit then
reaches another process's tabs as soon as its own, not up to a tick later.

The interface is the class `Feed`; each backend has its shared feed: a table and a file lock on
SQLite (backends/sqlite/feed.py), NOTIFY and a LISTEN connection on PostgreSQL
(backends/postgres/feed.py). Both carry frames pushed to other processes' tabs into the
writer's next batch through an `Outbox`, and the principals whose streams `lith.revoke` ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ConfigDict

from ..exceptions import StorageError, WriterClosed
from .commands import Command
from .frames import Frame
from .streams import Principal
from .tx import Tx

log = logging.getLogger("fastapi_lith.feed")

Push = tuple[str, Frame]  # a frame for every stream of one tab, wherever that stream lives


class Applier(Protocol):
    """What a feed hands its forwarded pushes to: the writer."""

    async def do(self, cmd: Command, *, key: str | None = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class Changes:
    """What other processes committed since the last poll."""

    topics: frozenset[str] = frozenset()
    pushes: tuple[Push, ...] = ()
    everything: bool = False  # changes may have been missed: every view renders again
    revoked: tuple[Principal, ...] = ()  # end these principals' streams


class Feed:
    """The interface between the writer, the hub and other processes.

    The base class is a feed for one process: the writer's commit subscriber already tells the
    hub, so there is nothing to publish, poll or forward. The writer calls `turn`, `setup` and
    `publish` on its own thread; the hub calls `poll`, `forward` and `revoke` on the event loop.
    """

    shared = False  # other processes publish here too: the hub polls at every tick
    # Seconds from another process's commit to this hub's poll taking it, and (PostgreSQL) to
    # this process receiving its NOTIFY: raw observations the metrics drain. None: not measured.
    lags: deque[float] | None = None
    notify_lags: deque[float] | None = None
    arrived: Callable[[], None] | None = None  # see `on_arrival`

    def on_arrival(self, arrived: Callable[[], None] | None) -> None:
        """Call `arrived` on the event loop as soon as another process's commit is there to poll,
        so the hub polls then rather than at its next tick (None: no more calls). A feed that
        cannot tell never calls it: the hub's poll at every tick is what it relies on."""
        self.arrived = arrived

    def _tell_arrived(self) -> None:
        """On the loop: something arrived; tell the hub, if it asked (`on_arrival`)."""
        if self.arrived is not None:
            self.arrived()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Held around each write transaction: writers of all processes take turns."""
        yield

    def setup(self, conn: Any) -> None:
        """Create what the feed needs in the database (writer thread, in `turn`, once)."""

    def publish(
        self, conn: Any, topics: Collection[str], pushes: Sequence[Push] = (), revoked: Sequence[Principal] = ()
    ) -> None:
        """Record a batch's topics, pushes and revocations inside its transaction, before COMMIT."""

    async def start(self, writer: Applier) -> None:
        """Begin listening; `writer` carries forwarded pushes into the feed."""

    def poll(self) -> Changes | None:
        """What other processes committed since the last call, or None (event loop, each tick)."""
        return None

    def forward(self, tab: str, frame: Frame) -> None:
        """Send a frame to the tab's streams in other processes (the hub served its own)."""

    async def revoke(self, principal: Principal) -> None:
        """End the principal's streams in other processes (the hub ended its own): returns once
        the writer committed it, so other hubs read it at their next poll."""

    async def close(self) -> None:
        """Stop listening and let go of the lock (after the writer closed)."""


class LocalFeed(Feed):
    """One process on the database: commits reach the hub through the writer alone."""


class Outbox:
    """Frames for other processes' tabs, carried into the writer's next batch, whatever else is
    forwarded meanwhile riding along: one feed entry (`Feed.publish`) for all of them."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.writer: Applier | None = None
        self._pushes: list[Push] = []
        self._sending: asyncio.Task[None] | None = None

    def put(self, tab: str, frame: Frame) -> None:
        self._pushes.append((tab, frame))
        if self._sending is None and self.writer is not None:
            self._sending = asyncio.get_running_loop().create_task(self._send(), name="lith-feed-forward")

    async def _send(self) -> None:
        assert self.writer is not None
        try:
            while self._pushes:
                pushes, self._pushes = self._pushes, []
                try:
                    await self.writer.do(_Forward.model_construct(feed=self.feed, pushes=pushes))
                except WriterClosed:
                    return
                except StorageError:  # a full disk: the writer has logged why, once
                    pass
                except Exception:  # a lost push must not break the app
                    log.exception("could not forward %d pushes", len(pushes))
        finally:
            self._sending = None

    async def revoke(self, principal: Principal) -> None:
        """One feed entry of its own, awaited: a revocation is rare and its caller (a logout)
        wants it written before answering."""
        if self.writer is not None:
            await self.writer.do(_Forward.model_construct(feed=self.feed, pushes=[], revoked=[principal]))

    def close(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
            self._sending = None
        self.writer = None


class _Forward(Command):
    """Pushes and revocations for other processes: one feed entry, in the writer's next batch."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    feed: Any
    pushes: list[Any]
    revoked: list[Any] = []

    def apply(self, tx: Tx) -> None:
        self.feed.publish(tx.conn, (), self.pushes, self.revoked)
