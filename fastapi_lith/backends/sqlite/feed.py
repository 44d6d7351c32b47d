"""The change feed on SQLite, for several processes on one file (see engine/feed.py for the why).

`SqliteFeed` keeps the feed in a small table of the database itself. A hub learns that anything
committed at all from `PRAGMA data_version` on a connection of its own, which costs no query of
the table; only then it reads the entries after the last one it saw. The table is pruned to its
newest `keep` entries, so a hub that finds a gap (it started, or fell further behind than that)
renders every view once instead of replaying: a spare render is cheap, a stale tab is a bug.

Writers of different processes take turns at the file through an OS lock (`flock` on a file
beside the database) around each batch's transaction. SQLite's own busy handler would have a
waiting writer sleep and poll in steps of up to 100 ms; the kernel wakes a waiting `flock` the
moment the lock is released.

After a batch that published something, the writer rings every other process's `Doorbell`, and
their hubs poll at once instead of at their next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ...engine.feed import Applier, Changes, Feed, Outbox, Push
from ...engine.frames import Frame
from ...engine.streams import Principal
from .db import open_sqlite

try:
    import fcntl
except ImportError:  # not Unix: writers fall back on SQLite's busy handler
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("fastapi_lith.feed")


class Doorbell:
    """Wakes the other processes' hubs on one file the moment a batch commits.

    Each process listens on a Unix datagram socket in Linux's abstract namespace, named by its
    feed's origin, and leaves an empty file of that name in `folder` (beside the database): the
    folder is the list of whom to ring. A ring nobody answers (a process killed with -9) removes
    that file. A doorbell only saves waiting: where it cannot work (not Linux; processes in
    different network namespaces) the hubs hear each other at their polls, every tick. Any
    process on the host could ring; a ring carries nothing, it only has the hub ask the database.
    """

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self.rung = 0  # rings sent
        self.heard = 0  # wake-ups taken (each may be several rings)
        self._listening: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ringing: socket.socket | None = None  # the writer thread's

    @staticmethod
    def address(name: str) -> bytes:
        return b"\0lith-feed-" + name.encode()

    def listen(self, heard: Callable[[], None]) -> bool:
        """Call `heard` on this event loop whenever another process rings; False: cannot here."""
        if sys.platform != "linux":
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self.address(self.name))
            sock.setblocking(False)
            self.folder.mkdir(exist_ok=True)
            (self.folder / self.name).touch()
        except OSError as exc:
            sock.close()
            log.info("feed: no doorbell (%s); other processes' commits are heard at each tick", exc)
            return False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._take, sock, heard)
        self._listening = sock
        return True

    def _take(self, sock: socket.socket, heard: Callable[[], None]) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: every ring read
            while True:
                sock.recv(16)
        self.heard += 1
        heard()

    def ring(self) -> None:
        """Wake every other listening process (writer thread, after the commit)."""
        try:
            names = os.listdir(self.folder)
        except OSError:  # nobody listens yet, or cannot here (the folder is made by `listen`)
            return
        sock = self._ringing
        if sock is None:
            sock = self._ringing = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
        for name in names:
            if name == self.name:
                continue
            try:
                sock.sendto(b"!", self.address(name))
            except ConnectionRefusedError:  # its process is gone: ring it no more
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / name)
            except OSError:  # its queue is full: it has rings to read already
                pass
            else:
                self.rung += 1

    def close(self) -> None:
        sock, self._listening = self._listening, None
        if sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(sock.fileno())
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.folder / self.name)
        if self._ringing is not None:
            self._ringing.close()
            self._ringing = None


class SqliteFeed(Feed):
    """The feed as a table in the database, for several processes on one SQLite file.

    `keep` entries are kept (pruned every `prune_every` batches); a hub further behind than
    that renders everything once. The lock file is the database's name plus `-lock`.
    """

    shared = True
    TABLE = "lith_feed"

    def __init__(self, path: str | Path, *, keep: int = 4096, prune_every: int = 256) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + "-lock")
        self.keep = keep
        self.prune_every = prune_every
        self.origin = secrets.token_hex(8)  # this process's entries: its hub heard them already
        self.doorbell = Doorbell(self.path.with_name(self.path.name + "-wake"), self.origin)
        self._published = False  # in this turn: ring the others once it is over
        self._lock_fd: int | None = None
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None
        self._last = 0  # the newest entry seen
        self._outbox = Outbox(self)
        # Counters the tests and benchmarks read.
        self.changed = 0  # polls that found data_version changed, so read the table
        self.reads = 0  # entries read
        self.gaps = 0  # times entries were pruned before this hub read them
        self.lags: deque[float] = deque(maxlen=4096)

    # -- the writer's side (writer thread) ---------------------------------------------------

    @contextmanager
    def turn(self) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        fd = self._lock_fd
        if fd is None:
            fd = self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o660)
        # flock belongs to this open file: it is released when the process dies, kill -9 too.
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._published = False
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        if self._published:  # committed (a failed batch raised past this)
            self.doorbell.ring()

    def setup(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.TABLE} ("
            " seq INTEGER PRIMARY KEY, origin TEXT NOT NULL, topics TEXT NOT NULL, pushes TEXT, revoked TEXT,"
            " at REAL)"
        )
        # A feed table from before revocations or commit times: columns more, which older
        # readers never select.
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({self.TABLE})")}
        for column, kind in (("revoked", "TEXT"), ("at", "REAL")):
            if column not in columns:
                conn.execute(f"ALTER TABLE {self.TABLE} ADD COLUMN {column} {kind}")

    def publish(
        self, conn: sqlite3.Connection, topics: Collection[str], pushes: Sequence[Push] = (),
        revoked: Sequence[Principal] = (),
    ) -> None:
        if not topics and not pushes and not revoked:
            return
        self._published = True
        sent = json.dumps([[tab, f.key, f.html, f.signals] for tab, f in pushes]) if pushes else None
        # Rows are only ever deleted below the newest, so the next seq is always the next number:
        # a gap in what a hub reads means entries were pruned before it saw them.
        seq = conn.execute(
            f"INSERT INTO {self.TABLE} (origin, topics, pushes, revoked, at) VALUES (?, ?, ?, ?, ?)",
            (self.origin, json.dumps(sorted(topics)), sent, json.dumps(list(revoked)) if revoked else None,
             time.time()),  # fmt: skip
        ).lastrowid
        if seq is not None and seq % self.prune_every == 0:
            conn.execute(f"DELETE FROM {self.TABLE} WHERE seq <= ?", (seq - self.keep,))

    # -- the hub's side (event loop) ---------------------------------------------------------

    async def start(self, writer: Applier) -> None:
        self._outbox.writer = writer
        conn = open_sqlite(self.path, read_only=True, cached_statements=4)
        # This connection is read on the event loop: never wait there, retry at the next tick.
        conn.execute("PRAGMA busy_timeout = 0")
        # A hub that starts has no frames yet: each view renders fresh as a stream opens it.
        self._version = conn.execute("PRAGMA data_version").fetchone()[0]
        self._last = conn.execute(f"SELECT coalesce(max(seq), 0) FROM {self.TABLE}").fetchone()[0]
        self._conn = conn
        self.doorbell.listen(self._tell_arrived)

    def poll(self) -> Changes | None:
        conn = self._conn
        if conn is None:
            return None
        try:
            # Changes whenever another connection committed: no query of the table until then.
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._version:
                return None
            self.changed += 1
            rows = conn.execute(
                f"SELECT seq, origin, topics, pushes, revoked, at FROM {self.TABLE} WHERE seq > ? ORDER BY seq",
                (self._last,),
            ).fetchall()
        except sqlite3.OperationalError as exc:  # busy (a recovery) or locked: next tick
            log.debug("feed poll deferred: %s", exc)
            return None
        self._version = version
        if not rows:
            return None
        self.reads += len(rows)
        everything = rows[0][0] != self._last + 1
        if everything:
            self.gaps += 1
            log.info("feed: %d entries missed, every view renders again", rows[0][0] - self._last - 1)
        self._last = rows[-1][0]
        topics: set[str] = set()
        pushes: list[Push] = []
        revoked: list[Principal] = []
        now = time.time()
        for _, origin, touched, sent, ended, at in rows:
            if origin == self.origin:
                continue
            if at is not None:  # None: written by a process from before commit times
                self.lags.append(now - at)
            if not everything:
                topics.update(json.loads(touched))
            if sent:
                pushes.extend((tab, Frame(key, html, signals)) for tab, key, html, signals in json.loads(sent))
            if ended:
                revoked.extend(json.loads(ended))
        if not topics and not pushes and not revoked and not everything:
            return None
        return Changes(frozenset(topics), tuple(pushes), everything, tuple(revoked))

    def forward(self, tab: str, frame: Frame) -> None:
        self._outbox.put(tab, frame)

    async def revoke(self, principal: Principal) -> None:
        await self._outbox.revoke(principal)

    async def close(self) -> None:
        self._outbox.close()
        self.doorbell.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
