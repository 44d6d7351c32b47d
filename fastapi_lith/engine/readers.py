"""`Readers`: the pool of read-only connections the hub renders through, on any backend.

Each connection is owned by one thread. `await readers.run(fn)` calls `fn(db)` on a reader
thread, in one read transaction, so everything `fn` reads shows one state. The database driver
releases the GIL while the database works, so reads overlap the writer and the event loop. A
backend says how a connection opens and how a read transaction begins and ends
(backends/sqlite/db.py, backends/postgres/db.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .db import Db
from .threads import Threads

T = TypeVar("T")


class Readers:
    """A pool of read-only connections, each owned by one thread (a backend's subclass opens them)."""

    BEGIN = "BEGIN"

    def __init__(self, *, size: int = 2, cached_statements: int = 128) -> None:
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._cached_statements = cached_statements
        self._threads = Threads(size, "lith-reader")

    def _open(self) -> Db:
        """A new read-only connection for this thread."""
        raise NotImplementedError

    def _usable(self, db: Db) -> bool:
        return True

    def _rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def _db(self) -> Db:
        db: Db | None = getattr(self._local, "db", None)
        if db is None or not self._usable(db):
            db = self._local.db = self._open()
            with self._lock:
                self._conns.append(db.conn)
        return db

    def call(self, fn: Callable[[Db], T]) -> T:
        """Run `fn` in one read transaction on this thread's connection (blocking)."""
        db = self._db()
        db.conn.execute(self.BEGIN)
        try:
            result = fn(db)
        except BaseException:
            self._rollback(db.conn)
            raise
        db.conn.execute("COMMIT")
        return result

    async def run(self, fn: Callable[[Db], T]) -> T:
        """Run `fn(db)` in one read transaction on a reader thread."""
        return await self._threads.run(self.call, fn)

    def close(self) -> None:
        self._threads.close()
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
