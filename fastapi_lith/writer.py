"""Linear writes: `Command`, `Tx` and the one `Writer` that owns the write connection.

Every change is a command. The writer applies commands in arrival order, up to `batch_size` in
one `BEGIN IMMEDIATE` transaction, each in its own savepoint, so a failing command rolls back
alone. One thread owns the connection and gets whole batches, one thread hop per batch: the
cost of a hop (about 60 µs) is paid once for hundreds of commands.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel
from starlette.requests import Request

from . import db
from .db import Db
from .statements import StatementCache

log = logging.getLogger("fastapi_lith.writer")

Topics = frozenset[str]
Subscriber = Callable[[Topics], None]


class Command(BaseModel):
    """A change to the database: validated by Pydantic, applied by the writer.

    `apply` is synchronous on purpose: it runs on the writer's thread inside a savepoint and
    does database work only, nothing that waits on the network. Its return value reaches the
    caller of `writer.do`; an exception it raises rolls back this command alone.
    """

    def apply(self, tx: Tx) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.apply(tx)")


class WriterClosed(RuntimeError):
    """The writer is shutting down or was never started: the command was not accepted."""


class Tx(Db):
    """What a command sees: the write connection inside its savepoint, and the topics it touches."""

    __slots__ = ("_touched",)

    def __init__(self, conn: sqlite3.Connection, cache: StatementCache) -> None:
        super().__init__(conn, cache)
        # One list for the whole batch: a rolled-back command's topics are cut off at its mark.
        self._touched: list[str] = []

    def touch(self, *topics: str) -> None:
        """Mark topics changed: views that watch them render in the next tick, if this commits."""
        self._touched.extend(topics)


class Writer:
    """The only writer of one SQLite file.

    `await writer.do(cmd)` queues the command and returns `cmd.apply(tx)`'s result once the
    batch holding it has committed. Used as a FastAPI dependency (`Depends(lith.writer)`) it also
    refuses cross-site requests, see `__call__`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        migrations: str | Path | None = None,
        synchronous: db.Synchronous = "NORMAL",
        batch_size: int = 512,
        cached_statements: int = 512,
        statement_cache: bool = True,
        same_origin_only: bool = True,
        max_body: int = 64 * 1024,
    ) -> None:
        self.path = Path(path)
        self.migrations = migrations
        self.synchronous = synchronous
        self.batch_size = batch_size
        self.same_origin_only = same_origin_only
        self.max_body = max_body
        self.statements = StatementCache(cached_statements, enabled=statement_cache)
        self._cached_statements = cached_statements if statement_cache else 0
        self._queue: deque[tuple[Command, asyncio.Future[Any]]] = deque()
        self._wake = asyncio.Event()
        self._subscribers: list[Subscriber] = []
        self._conn: sqlite3.Connection | None = None
        self._thread: db.Workers | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = True
        self._loop: asyncio.AbstractEventLoop | None = None
        # Counters a user and the benchmarks read.
        self.commands = 0
        self.failed = 0
        self.batches = 0
        self.commit_seconds: deque[float] = deque(maxlen=100_000)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the write connection on the writer thread, migrate, start taking commands."""
        self._loop = asyncio.get_running_loop()
        self._thread = db.Workers(1, "lith-writer")
        try:
            await self._thread.run(self._open)
        except BaseException:
            self._thread.close()
            raise
        self._wake = asyncio.Event()  # bound to this loop: a Lith may start again on another
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="lith-writer")
        # Start-up leaves ~80k long-lived objects (fastapi, SQLAlchemy, pydantic): frozen, the
        # collector stops walking them. Under 200 producers collection fell from 17% of the
        # time to 4%, and its pauses from 100+ ms to a few (bench/RESULTS.md, Writer).
        gc.collect()
        gc.freeze()

    def _open(self) -> None:
        conn = db.connect(
            self.path, synchronous=self.synchronous, cached_statements=self._cached_statements
        )
        try:
            if self.migrations is not None:
                before, after = db.migrate(conn, self.migrations)
                if after != before:
                    log.info("%s: migrated from version %d to %d", self.path.name, before, after)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def close(self) -> None:
        """Stop taking commands, commit every accepted one, close the connection."""
        if self._task is None:
            return
        self._closing = True
        self._wake.set()
        await self._task
        self._task = None
        assert self._thread is not None
        await self._thread.run(self._close_conn)
        self._thread.close()

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.execute("PRAGMA optimize")
            self._conn.close()
            self._conn = None

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call `fn(topics)` on the event loop after each commit that touched topics."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn)

    # -- the producer side -----------------------------------------------------------------

    async def do(self, cmd: Command) -> Any:
        """Apply `cmd` in the next batch; return its result once that batch has committed.

        Cancelled before the writer takes it, the command is dropped; once taken, it commits
        whatever happens to the caller.
        """
        if self._closing:
            raise WriterClosed("the writer is not running")
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._queue.append((cmd, fut))
        self._wake.set()
        return await fut

    async def __call__(self, request: Request) -> Writer:
        """The FastAPI dependency for command routes: refuse cross-site and non-Datastar requests.

        A browser sends `Sec-Fetch-Site` on every fetch; older ones send `Origin`. Requiring
        `Datastar-Request: true` as well makes a plain HTML form on another site useless.
        Non-browser clients and tests turn this off with `Lith(..., same_origin_only=False)`.
        """
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise HTTPException(413, f"request body over {self.max_body} bytes")
        if self.same_origin_only:
            reason = cross_site_reason(request)
            if reason:
                raise HTTPException(403, reason)
        return self

    # -- the writer task and thread ----------------------------------------------------------

    async def _run(self) -> None:
        queue, size, thread = self._queue, self.batch_size, self._thread
        assert thread is not None
        while True:
            if not queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch: list[Command] = []
            futures: list[asyncio.Future[Any]] = []
            while queue and len(batch) < size:
                cmd, fut = queue.popleft()
                if not fut.cancelled():
                    batch.append(cmd)
                    futures.append(fut)
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results, errors, topics = await thread.run(self._apply, batch)
            except BaseException as exc:  # the COMMIT itself failed: nothing in the batch landed
                log.exception("batch of %d commands failed to commit", len(batch))
                for fut in futures:
                    if not fut.done():
                        fut.set_exception(exc)
                self.failed += len(batch)
                continue
            self.commit_seconds.append(time.perf_counter() - started)
            self.batches += 1
            self.commands += len(batch)
            for fut, result, error in zip(futures, results, errors):
                if fut.done():
                    continue
                if error is None:
                    fut.set_result(result)
                else:
                    self.failed += 1
                    fut.set_exception(error)
            if topics:
                for fn in list(self._subscribers):
                    try:
                        fn(topics)
                    except Exception:
                        log.exception("commit subscriber %r failed", fn)

    def _apply(self, batch: list[Command]) -> tuple[list[Any], list[BaseException | None], Topics]:
        """Run one batch in one transaction, each command in its own savepoint (writer thread)."""
        conn = self._conn
        assert conn is not None
        n = len(batch)
        errors: list[BaseException | None] = [None] * n
        pending = range(n)
        while True:
            results: list[Any] = [None] * n
            tx = Tx(conn, self.statements)
            touched = tx._touched
            cur = conn.cursor()
            lost = None
            cur.execute("BEGIN IMMEDIATE")
            for i in pending:
                cur.execute("SAVEPOINT cmd")
                mark = len(touched)
                try:
                    results[i] = batch[i].apply(tx)
                except Exception as exc:
                    errors[i] = exc
                    del touched[mark:]
                    if not conn.in_transaction:  # SQLite rolled the whole transaction back
                        lost = i
                        break
                    cur.execute("ROLLBACK TO cmd")
                    cur.execute("RELEASE cmd")
                else:
                    cur.execute("RELEASE cmd")
            if lost is None:
                try:
                    cur.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return results, errors, frozenset(touched)
            # Rare: an error that ends the transaction (SQLITE_FULL, an interrupted statement).
            # The command that caused it keeps its error; the others run again from the start.
            pending = [i for i in range(n) if errors[i] is None]


def cross_site_reason(request: Request) -> str | None:
    """Why a command request is refused, or None: it must be same-origin and from Datastar."""
    if request.headers.get("datastar-request") != "true":
        return "command requests must come from Datastar (Datastar-Request: true)"
    return same_origin_reason(request)


def same_origin_reason(request: Request) -> str | None:
    """Why a request is refused as cross-site, or None when it is same-origin.

    Routes that cannot carry `Datastar-Request` (a `navigator.sendBeacon`) check this alone.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = request.headers.get("origin")
    if origin is None:
        return "cross-site request refused (no Sec-Fetch-Site or Origin header)"
    # Scheme and host both: `https://host` and `http://host.evil.example` are other origins.
    expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin != expected:
        return f"cross-site request refused (Origin {origin} is not {expected})"
    return None
