"""The change feed on PostgreSQL: NOTIFY inside each batch, one LISTEN connection per process.

The writer sends its batch's topics with `pg_notify` just before COMMIT: PostgreSQL delivers
them to every listener when, and only if, the transaction commits. Each process keeps one
connection that LISTENs, on a thread of its own, and its hub takes what arrived at once (and
at every tick, which catches anything else).

A notification carries fewer than 8000 bytes. Topics are packed into as many notifications as
they need; a pushed frame too large for one is written to a small table and its row id is sent
instead. A listening connection that drops may miss notifications, so once it is back every
view renders again: a spare render is cheap, a stale tab is a bug.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

import psycopg

from ...engine.feed import Applier, Changes, Feed, Outbox, Push
from ...engine.frames import Frame
from ...engine.streams import Principal
from .db import dsn

log = logging.getLogger("fastapi_lith.pgfeed")

CHANNEL = "lith_feed"
LIMIT = 7900  # bytes of one payload: PostgreSQL refuses 8000 and more
LISTENER_NAME = "lith-listen"  # application_name of the listening connection (pg_stat_activity)
PUSHES_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lith_feed_push"
    " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at double precision NOT NULL, body text NOT NULL)"
)
KEEP_PUSHES = 600.0  # seconds a large push's row is kept for the listeners to read it


class NotifyFeed(Feed):
    """Topics and pushes through LISTEN/NOTIFY, for any number of processes on one server."""

    shared = True

    def __init__(self, url: str, *, channel: str = CHANNEL) -> None:
        self.url = url
        self.channel = channel
        self.origin = secrets.token_hex(8)  # this process's notifications: its hub has them
        # Filled by the listener thread: what arrived, and when its batch committed, if known.
        self._inbox: deque[tuple[str, Any, float | None]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._outbox = Outbox(self)
        self._next_prune = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None  # the hub's, told when something arrives
        self._telling = False  # a call to `arrived` is on its way: later arrivals ride with it
        # Counters the tests and benchmarks read.
        self.received = 0  # notifications from other processes
        self.reconnects = 0
        self.stored = 0  # pushes too large for a payload, sent through the table
        self.lags: deque[float] = deque(maxlen=4096)
        self.notify_lags: deque[float] = deque(maxlen=4096)

    # -- the writer's side (writer thread, inside the batch's transaction) --------------------

    def setup(self, conn: Any) -> None:
        conn.execute(PUSHES_SCHEMA)

    def publish(
        self, conn: Any, topics: Collection[str], pushes: Sequence[Push] = (), revoked: Sequence[Principal] = ()
    ) -> None:
        if not topics and not pushes and not revoked:
            return
        payloads = list(self._pack(sorted(topics), time.time()))
        bodies = [json.dumps({"o": self.origin, "p": [tab, f.key, f.html, f.signals]}) for tab, f in pushes]
        bodies += [json.dumps({"o": self.origin, "x": principal}) for principal in revoked]
        for body in bodies:
            if len(body.encode()) <= LIMIT:
                payloads.append(body)
                continue
            # Too large for NOTIFY: the row commits with the batch, the listeners read it.
            row = conn.execute(
                "INSERT INTO lith_feed_push (at, body) VALUES (%s, %s) RETURNING id", (time.time(), body)
            ).fetchone()
            payloads.append(json.dumps({"o": self.origin, "r": row[0]}))
            self.stored += 1
            if time.monotonic() >= self._next_prune:
                conn.execute("DELETE FROM lith_feed_push WHERE at < %s", (time.time() - KEEP_PUSHES,))
                self._next_prune = time.monotonic() + KEEP_PUSHES / 4
        cur = conn.cursor()
        for payload in payloads:
            cur.execute("SELECT pg_notify(%s, %s)", (self.channel, payload), prepare=True)

    def _pack(self, topics: list[str], at: float) -> Any:
        """Topics in payloads under the limit, as few as fit, each with its commit time `at`
        (seconds since the epoch: the listeners measure how late they hear it)."""
        head = f'{{"o": "{self.origin}", "c": {at!r}, "t": '
        chunk: list[str] = []
        size = len(head) + 2
        for topic in topics:
            cost = len(json.dumps(topic).encode()) + 2
            if len(head) + 2 + cost > LIMIT:  # one topic alone is too long: everything renders
                yield json.dumps({"o": self.origin, "a": 1})
                continue
            if size + cost > LIMIT and chunk:
                yield json.dumps({"o": self.origin, "c": at, "t": chunk})
                chunk, size = [], len(head) + 2
            chunk.append(topic)
            size += cost
        if chunk:
            yield json.dumps({"o": self.origin, "c": at, "t": chunk})

    # -- the listener (its own thread) ---------------------------------------------------------

    async def start(self, writer: Applier) -> None:
        self._outbox.writer = writer
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._listen, name="lith-listen", daemon=True)
        self._thread.start()
        # Listening before the app serves: a commit after start-up is never missed.
        await asyncio.get_running_loop().run_in_executor(None, self._listening.wait, 10.0)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn(self.url), autocommit=True, application_name=LISTENER_NAME)
        conn.execute(f'LISTEN "{self.channel}"')
        return conn

    def _listen(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        delay = 0.05
        while not self._stop.is_set():
            if conn is None or conn.closed:
                try:
                    conn = self._connect()
                except psycopg.Error as exc:
                    log.warning("feed: cannot listen (%s); trying again in %.2f s", exc, delay)
                    self._stop.wait(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                delay = 0.05
                if self._listening.is_set():  # back after a drop: notifications may be lost
                    self.reconnects += 1
                    self._inbox.append(("a", None, None))
                    self._tell()
                    log.info("feed: listening again; every view renders once")
                self._listening.set()
            try:
                refs = []
                # Never left early: notifications already read with the one at hand would be
                # dropped. Stored pushes are read when it ends, within 0.2 s.
                for note in conn.notifies(timeout=0.2):
                    refs.extend(self._take(note.payload))
                    self._tell()
                if refs:
                    rows = conn.execute("SELECT body FROM lith_feed_push WHERE id = ANY(%s) ORDER BY id", (refs,))
                    for (body,) in rows.fetchall():
                        self._take(body)
                    self._tell()
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    log.warning("feed: the listening connection dropped (%s)", exc)
                conn.close()
        if conn is not None:
            conn.close()

    def _take(self, payload: str) -> list[int]:
        """One notification into the inbox; returns the row ids of pushes stored in the table."""
        try:
            note = json.loads(payload)
        except ValueError:
            log.warning("feed: unreadable notification %.80r", payload)
            return []
        if note.get("o") == self.origin:
            return []
        self.received += 1
        if "r" in note:
            return [int(note["r"])]
        if "t" in note:
            at = note.get("c")  # absent from a process from before commit times
            if at is not None:
                self.notify_lags.append(time.time() - at)
            self._inbox.append(("t", note["t"], at))
        elif "p" in note:
            tab, key, html, signals = note["p"]
            self._inbox.append(("p", (tab, Frame(key, html, signals)), None))
        elif "x" in note:
            self._inbox.append(("x", note["x"], None))
        elif "a" in note:
            self._inbox.append(("a", None, None))
        return []

    def _tell(self) -> None:
        """Have the hub poll now: one call on its loop for everything that arrives until then."""
        loop = self._loop
        if not self._inbox or self._telling or loop is None:
            return
        self._telling = True
        try:
            loop.call_soon_threadsafe(self._told)
        except RuntimeError:  # the loop closed: the hub is gone
            self._telling = False

    # -- the hub's side (event loop) ---------------------------------------------------------

    def _told(self) -> None:
        self._telling = False
        self._tell_arrived()

    def poll(self) -> Changes | None:
        inbox = self._inbox
        if not inbox:
            return None
        topics: set[str] = set()
        pushes: list[Push] = []
        revoked: list[Principal] = []
        everything = False
        now = time.time()
        while inbox:
            kind, value, at = inbox.popleft()
            if kind == "t":
                topics.update(value)
                if at is not None:
                    self.lags.append(now - at)
            elif kind == "p":
                pushes.append(value)
            elif kind == "x":
                revoked.append(value)
            else:
                everything = True
        return Changes(frozenset(topics), tuple(pushes), everything, tuple(revoked))

    def forward(self, tab: str, frame: Frame) -> None:
        self._outbox.put(tab, frame)  # into the writer's next batch, as on SQLite

    async def revoke(self, principal: Principal) -> None:
        await self._outbox.revoke(principal)

    async def close(self) -> None:
        self._outbox.close()
        self._stop.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
        self._listening.clear()
        self._loop = None
