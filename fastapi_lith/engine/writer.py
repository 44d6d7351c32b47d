"""Linear writes: `Tx` and the one `Writer` that owns the write connection.

Every change is a command. The writer applies commands in arrival order, up to `batch_size` in
one `BEGIN IMMEDIATE` transaction, each in its own savepoint, so a failing command rolls back
alone. One thread owns the connection and gets whole batches, one thread hop per batch: the
cost of a hop is paid once for hundreds of commands.
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
from typing import TYPE_CHECKING, Any

from . import db
from .. import settings
from .commands import Command, run_apply
from .db import Db
from ..exceptions import Rejected, StorageError, WriterClosed
from .outcomes import (
    FIND_OUTCOME,
    OUTCOMES_SCHEMA,
    PRUNE_OUTCOMES,
    PRUNE_TABS,
    RECORD_OUTCOME,
    TAB_KEEP,
    TABS_SCHEMA,
    dump_outcome,
    load_outcome,
)
from .statements import DIALECT, StatementCache
from .storage import Probe, StorageState, storage_cause

if TYPE_CHECKING:
    from .feed import Feed

log = logging.getLogger("fastapi_lith.writer")

Topics = frozenset[str]
Subscriber = Callable[[Topics], None]


class Tx(Db):
    """What a command sees: the write connection inside its savepoint, and the topics it touches."""

    __slots__ = ("_touched",)

    def __init__(self, conn: sqlite3.Connection, cache: StatementCache) -> None:
        super().__init__(conn, cache)
        # One list for the whole batch: a rolled-back command's topics are cut off at its mark.
        self._touched: list[str] = []

    def touch(self, *topics: str) -> None:
        """Mark topics changed: views that watch them render in the next tick, if this commits."""
        for topic in topics:
            if type(topic) is not str:  # a list here would fail the whole batch's commit
                settings.topic_names("tx.touch", topics)
        self._touched.extend(topics)


class Writer:
    """The only writer of one SQLite file.

    `await writer.do(cmd)` queues the command and returns `cmd.apply(tx)`'s result once the
    batch holding it has committed.
    """

    dialect = DIALECT  # what the statement cache compiles for: another backend names its own

    @settings.checked()
    def __init__(
        self,
        path: str | Path,
        *,
        migrations: str | Path | None = None,
        synchronous: db.Synchronous = "NORMAL",
        batch_size: int = 512,
        cached_statements: int = 512,
        statement_cache: bool = True,
        repeat_window: float = 3600.0,
        wal_autocheckpoint: int = 1000,
        feed: Feed | None = None,
    ) -> None:
        self.path = Path(path)
        from .feed import LocalFeed  # here: feed.py builds on this module

        # One process by default: its hub hears of commits through `subscribe` alone.
        self.feed = feed if feed is not None else LocalFeed()
        # SQLite's default; raised while Litestream replicates, since it checkpoints itself.
        self.wal_autocheckpoint = wal_autocheckpoint
        self.migrations = migrations
        self.synchronous = settings.choice("synchronous", synchronous, db.SYNCHRONOUS)
        self.batch_size = settings.number("batch_size", batch_size, low=1, integer=True)
        settings.number("cached_statements", cached_statements, low=0, integer=True)
        # How long a command's first outcome answers its repeats; 0 turns keys off.
        self.repeat_window = settings.number("repeat_window", repeat_window, low=0)
        self.statements = StatementCache(
            cached_statements, enabled=settings.flag("statement_cache", statement_cache), dialect=self.dialect
        )
        self._cached_statements = cached_statements if statement_cache else 0
        self._queue: deque[tuple[Command, str | None, asyncio.Future[Any]]] = deque()
        self._wake = asyncio.Event()
        self._subscribers: list[Subscriber] = []
        self._conn: sqlite3.Connection | None = None
        self._thread: db.Workers | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_prune = 0.0
        # Counters a user and the benchmarks read.
        self.commands = self.failed = self.repeats = self.batches = 0
        self.commit_seconds: deque[float] = deque(maxlen=100_000)
        self.storage = StorageState()  # a full disk, a read-only file: see `probe`

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
        self._task.add_done_callback(self._stopped)
        # Start-up leaves many long-lived objects (fastapi, SQLAlchemy, pydantic): frozen, the
        # collector stops walking them, its pauses under load (bench/RESULTS.md, Writer).
        gc.collect()
        gc.freeze()

    def _open(self) -> None:
        # Processes starting at once take turns: switching a new file to WAL and migrating
        # both want the file to themselves.
        with self.feed.turn():
            conn = db.connect(
                self.path, synchronous=self.synchronous, cached_statements=self._cached_statements
            )
            try:
                conn.execute(f"PRAGMA wal_autocheckpoint = {int(self.wal_autocheckpoint)}")
                if self.migrations is not None:
                    before, after = db.migrate(conn, self.migrations)
                    if after != before:
                        log.info("%s: migrated from version %d to %d", self.path.name, before, after)
                conn.executescript(f"BEGIN IMMEDIATE;{OUTCOMES_SCHEMA};{TABS_SCHEMA};COMMIT;")
                self._prune(conn.cursor())
                self.feed.setup(conn)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.close()
                raise
        self._conn = conn

    def _prune(self, cur: sqlite3.Cursor) -> None:
        """Forget outcomes older than the window (in the caller's transaction, if any)."""
        now = time.time()
        cur.execute(PRUNE_OUTCOMES, (now - self.repeat_window,))
        cur.execute(PRUNE_TABS, (now - TAB_KEEP,))
        self._next_prune = time.monotonic() + min(self.repeat_window, 3600.0) / 4

    async def close(self) -> None:
        """Stop taking commands, commit every accepted one, close the connection."""
        task = self._task
        if task is None:
            return
        self._closing = True
        self._wake.set()
        # Not `await task`: cancelling close() must not cancel a drain in progress. A task
        # cancelled by someone else has already told its callers what happened.
        await asyncio.wait((task,))
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("the writer task failed", exc_info=task.exception())
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

    async def do(self, cmd: Command, *, key: str | None = None) -> Any:
        """Apply `cmd` in the next batch; return its result once that batch has committed.

        Cancelled before the writer takes it, the command is dropped; once taken, it commits
        whatever happens to the caller. A command with an idempotency key (`key`, else its own,
        see `Command.idempotency_key`) whose first send committed within `repeat_window` is not
        applied again: this returns (or raises) that first outcome.
        """
        if self._closing:
            raise WriterClosed("the writer is not running")
        if key is None:
            key = cmd.idempotency_key()
        if not self.repeat_window:
            key = None
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._queue.append((cmd, key, fut))
        self._wake.set()
        try:
            return await fut
        except Rejected as exc:
            exc.command = cmd  # how a route that lets it through answers depends on the command
            raise

    async def probe(self) -> str | None:
        """For a health route: None if the file takes a write now, else why not. A full disk
        fails no read, so only a write can tell (one row written and deleted, in the next batch)."""
        try:
            await self.do(Probe())
        except Exception as exc:
            return str(exc) or type(exc).__name__
        return None

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
            keys: list[str | None] = []
            futures: list[asyncio.Future[Any]] = []
            keyed = False
            while queue and len(batch) < size:
                cmd, key, fut = queue.popleft()
                if not fut.cancelled():
                    batch.append(cmd)
                    keys.append(key)
                    futures.append(fut)
                    keyed = keyed or key is not None
            if not batch:
                continue
            started = time.perf_counter()
            # The batch is SQLite's now: a cancel of this task cannot cancel `outcome`, so it
            # lands once the COMMIT's outcome is in, and each caller still learns the truth.
            outcome = thread.submit(self._apply, batch, keys if keyed else None, settled=True)
            try:
                await outcome
            except asyncio.CancelledError:
                raise
            except BaseException:
                pass  # the COMMIT failed: `_settle` hands the error to every caller
            finally:
                self._settle(outcome, futures, started)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The task ended (closed, cancelled, even before it ran, or a bug): commands never
        taken were not applied, and their callers may send them again."""
        self._closing = True
        while self._queue:
            _, _, fut = self._queue.popleft()
            if not fut.done():
                fut.set_exception(WriterClosed("the writer stopped before taking the command"))

    def _settle(self, outcome: asyncio.Future[Any], futures: list[asyncio.Future[Any]], started: float) -> None:
        """Hand each caller its result or error, then tell the subscribers what changed."""
        exc = outcome.exception()
        if exc is not None:  # the COMMIT itself failed: nothing in the batch landed
            exc = self.storage.refusal(exc)  # a full disk: a StorageError (503), logged once
            if not isinstance(exc, StorageError):
                log.error("batch of %d commands failed to commit", len(futures), exc_info=exc)
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            self.failed += len(futures)
            return
        results, errors, topics, repeats = outcome.result()
        self.storage.succeeded()
        self.commit_seconds.append(time.perf_counter() - started)
        self.batches += 1
        self.commands += len(futures)
        self.repeats += repeats
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

    def _apply(
        self, batch: list[Command], keys: list[str | None] | None
    ) -> tuple[list[Any], list[BaseException | None], Topics, int]:
        """Run one batch in this process's turn at the file (see `Feed.turn`), writer thread."""
        with self.feed.turn():
            try:
                return self._transaction(batch, keys)
            except BaseException:  # a full disk in a command, or at any statement of the batch
                if self._conn is not None and self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")  # else the next batch's BEGIN would fail
                raise

    def _transaction(
        self, batch: list[Command], keys: list[str | None] | None
    ) -> tuple[list[Any], list[BaseException | None], Topics, int]:
        """Run one batch in one transaction, each command in its own savepoint (writer thread).

        `keys` (None when no command has one) are the idempotency keys: a key with an outcome
        in the window answers with it instead of applying; a new one records its outcome in the
        command's savepoint, or after rolling the command back, so both commit together.
        """
        conn = self._conn
        assert conn is not None
        n = len(batch)
        errors: list[BaseException | None] = [None] * n
        pending = range(n)
        now = time.time()
        since = now - self.repeat_window
        while True:
            results: list[Any] = [None] * n
            repeats = 0
            tx = Tx(conn, self.statements)
            touched = tx._touched
            cur = conn.cursor()
            lost = None
            cur.execute("BEGIN IMMEDIATE")
            if time.monotonic() >= self._next_prune:
                self._prune(cur)
            for i in pending:
                key = None if keys is None else keys[i]
                if key is not None:
                    row = cur.execute(FIND_OUTCOME, (key, since)).fetchone()
                    if row is not None:  # a repeat: its first outcome, nothing applied
                        ok, value = load_outcome(row[0])
                        if ok:
                            results[i] = value
                        else:
                            errors[i] = value
                        repeats += 1
                        continue
                cur.execute("SAVEPOINT cmd")
                mark = len(touched)
                cmd = batch[i]
                try:
                    result = run_apply(cmd, tx)
                    cmd._settled(tx, None)
                    if key is not None:
                        cur.execute(RECORD_OUTCOME, (key, now, dump_outcome(True, result)))
                    results[i] = result
                except Exception as exc:
                    if storage_cause(exc) is not None:
                        raise  # the disk's fault, not the command's: the whole batch fails
                    errors[i] = exc
                    del touched[mark:]
                    if not conn.in_transaction:  # SQLite rolled the whole transaction back
                        lost = i
                        break
                    cur.execute("ROLLBACK TO cmd")
                    cur.execute("RELEASE cmd")
                    cmd._settled(tx, exc)
                    if key is not None:
                        cur.execute(RECORD_OUTCOME, (key, now, dump_outcome(False, exc)))
                else:
                    cur.execute("RELEASE cmd")
            if lost is None:
                try:  # whatever fails here, the transaction must not stay open for the next batch
                    topics = frozenset(touched)
                    self.feed.publish(conn, topics)  # other processes' hubs read it once committed
                    cur.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return results, errors, topics, repeats
            # Rare: an error that ends the transaction (an interrupted statement; a full disk
            # failed the batch above). The command that caused it keeps its error; the others
            # run again from the start.
            pending = [i for i in range(n) if errors[i] is None]
