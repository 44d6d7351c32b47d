"""Linear writes: the one `Writer` of a process, over its backend's `Store`.

Every change is a command. The writer applies commands in arrival order, up to `batch_size` in
one transaction, each in its own savepoint, so a failing command rolls back alone. One thread
owns the write connection and gets whole batches, one thread hop per batch: the cost of a hop
is paid once for hundreds of commands. What the transaction looks like is the store's (see
store.py); the queue, the futures, the counters and the subscribers are the same on every
backend, and live here.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import settings
from ..exceptions import Rejected, StorageError, WriterClosed
from . import collector
from .commands import Command
from .feed import Feed, LocalFeed
from .statements import StatementCache
from .storage import Probe, StorageState
from .store import Batch, Store
from .threads import Threads
from .tx import Topics

log = logging.getLogger("fastapi_lith.writer")

Subscriber = Callable[[Topics], None]

# When `do` accepted a command (`time.time_ns()`) and its caller's context, where a tracer
# finds the caller's span: recorded only while the writer has a tracer.
Origin = tuple[int, contextvars.Context]


@dataclass(frozen=True, slots=True)
class TracedBatch:
    """One batch as a tracer sees it (ops/tracing.py), once its callers were answered.

    The writer stamps these times (`time.time_ns()`) whatever the tracer does with them, so no
    span object exists on the writer's path, and nothing at all while it has no tracer.
    """

    cmds: list[Command]
    keys: list[str | None]
    origins: list[Origin | None]  # None: accepted before the tracer was set
    taken: int  # the batch left the queue
    committed: int  # its COMMIT's outcome was in
    outcome: Batch | BaseException  # its answers and topics, or why its COMMIT failed


BatchTracer = Callable[[TracedBatch], None]


# Each default of a writer, written once: the backends' writers and `Lith` take theirs from here.
BATCH_SIZE = 512
CACHED_STATEMENTS = 512
REPEAT_WINDOW = 3600.0  # seconds a keyed command's first outcome answers its repeats
# Batches kept for the metrics' sampler between two of its passes (ops/metrics.py): bounded, so
# a process nobody samples holds no more than this.
OBSERVED = 65_536


class Writer:
    """The only writer of one database in this process, over `store`.

    `await writer.do(cmd)` queues the command and returns `cmd.apply(tx)`'s result once the
    batch holding it has committed. A backend builds one (`fastapi_lith.Writer` on a SQLite
    file, backends/postgres/writer.py's `PgWriter`), passing its store and, for several
    processes, the feed (`LocalFeed` otherwise).
    """

    @settings.checked()
    def __init__(
        self,
        store: Store,
        *,
        feed: Feed | None = None,
        batch_size: int = BATCH_SIZE,
        cached_statements: int = CACHED_STATEMENTS,
        statement_cache: bool = True,
        repeat_window: float = REPEAT_WINDOW,
    ) -> None:
        self.store = store
        self.path = store.path  # the file, None on a server: `describe()` names either
        self.dialect = store.dialect  # what the statement cache compiles for
        # One process by default: its hub hears of commits through `subscribe` alone.
        self.feed = feed if feed is not None else LocalFeed()
        self.batch_size = settings.number("batch_size", batch_size, low=1, integer=True)
        settings.number("cached_statements", cached_statements, low=0, integer=True)
        # How long a command's first outcome answers its repeats; 0 turns keys off.
        self.repeat_window = settings.number("repeat_window", repeat_window, low=0)
        self.statements = StatementCache(
            cached_statements, enabled=settings.flag("statement_cache", statement_cache), dialect=self.dialect
        )
        self._queue: deque[tuple[Command, str | None, asyncio.Future[Any], Origin | None]] = deque()
        self._wake = asyncio.Event()
        self._subscribers: list[Subscriber] = []
        self._thread: Threads | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_prune = 0.0
        # Counters a user and the benchmarks read.
        self.commands = self.failed = self.repeats = self.batches = 0
        self.failed_batches = self.lost = 0  # batches whose COMMIT failed, and their commands
        self.repeated_errors = 0  # repeats answered with a first outcome that was an error
        self.busy_seconds = 0.0  # spent applying and committing batches
        self.commit_seconds: deque[float] = deque(maxlen=100_000)
        # `(batch size, seconds)` of each committed batch, drained by the metrics' sampler.
        self.observed: deque[tuple[int, float]] = deque(maxlen=OBSERVED)
        self.storage = StorageState()  # a full disk, a read-only file: see `probe`
        self.trace: BatchTracer | None = None  # told of each batch, when the app traces (ops/tracing.py)

    def describe(self) -> str:
        """What this writer writes to, for logs: the file's name, or the server's database."""
        return self.store.describe()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the write connection on the writer thread, migrate, start taking commands."""
        self._loop = asyncio.get_running_loop()
        self._thread = Threads(1, "lith-writer")
        try:
            await self._thread.run(self._open)
        except BaseException:
            self._thread.close()
            raise
        self._wake = asyncio.Event()  # bound to this loop: a Lith may start again on another
        self._closing = False
        self._task = asyncio.create_task(self._run(), name="lith-writer")
        self._task.add_done_callback(self._stopped)
        collector.freeze_startup()

    def _open(self) -> None:
        self.store.open(self.feed, self.statements, time.time() - self.repeat_window)
        self._pruned()

    def _pruned(self) -> None:
        """Outcomes older than the window were just forgotten: when to forget again."""
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
        await self._thread.run(self.store.close)
        self._thread.close()

    @property
    def queued(self) -> int:
        """Commands accepted and not yet taken into a batch."""
        return len(self._queue)

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
        origin = (time.time_ns(), contextvars.copy_context()) if self.trace is not None else None
        self._queue.append((cmd, key, fut, origin))
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
            trace = self.trace
            origins: list[Origin | None] = []
            keyed = False
            while queue and len(batch) < size:
                cmd, key, fut, origin = queue.popleft()
                if not fut.cancelled():
                    batch.append(cmd)
                    keys.append(key)
                    futures.append(fut)
                    keyed = keyed or key is not None
                    if trace is not None:
                        origins.append(origin)
            if not batch:
                continue
            started = time.perf_counter()
            taken = time.time_ns() if trace is not None else 0
            # The batch is the store's now: a cancel of this task cannot cancel `outcome`, so it
            # lands once the COMMIT's outcome is in, and each caller still learns the truth.
            outcome = thread.submit(self._apply, batch, keys if keyed else None, settled=True)
            try:
                await outcome
            except asyncio.CancelledError:
                raise
            except BaseException:
                pass  # the COMMIT failed: `_settle` hands the error to every caller
            finally:
                # Before the subscribers hear of the commit: a render begun later shows it.
                committed = time.time_ns() if trace is not None else 0
                self._settle(outcome, futures, started)
                if trace is not None:
                    result = outcome.exception() or outcome.result()
                    self._trace(trace, TracedBatch(batch, keys, origins, taken, committed, result))

    @staticmethod
    def _trace(trace: BatchTracer, batch: TracedBatch) -> None:
        try:
            trace(batch)
        except Exception:  # a broken tracer must not end the writer
            log.exception("batch tracer %r failed", trace)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The task ended (closed, cancelled, even before it ran, or a bug): commands never
        taken were not applied, and their callers may send them again."""
        self._closing = True
        while self._queue:
            _, _, fut, _ = self._queue.popleft()
            if not fut.done():
                fut.set_exception(WriterClosed("the writer stopped before taking the command"))

    def _settle(self, outcome: asyncio.Future[Any], futures: list[asyncio.Future[Any]], started: float) -> None:
        """Hand each caller its result or error, then tell the subscribers what changed."""
        seconds = time.perf_counter() - started
        self.busy_seconds += seconds
        exc = outcome.exception()
        if exc is not None:  # the COMMIT itself failed: nothing in the batch landed
            exc = self.storage.refusal(exc)  # a full disk: a StorageError (503), logged once
            if not isinstance(exc, StorageError):
                log.error("batch of %d commands failed to commit", len(futures), exc_info=exc)
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            self.failed += len(futures)
            self.failed_batches += 1
            self.lost += len(futures)
            return
        batch: Batch = outcome.result()
        results, errors, topics = batch.results, batch.errors, batch.topics
        self.storage.succeeded()
        self.commit_seconds.append(seconds)
        self.observed.append((len(futures), seconds))
        self.batches += 1
        self.commands += len(futures)
        self.repeats += batch.repeats
        self.repeated_errors += batch.repeated_errors
        for fut, result, error in zip(futures, results, errors, strict=True):
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

    def _apply(self, cmds: list[Command], keys: list[str | None] | None) -> Batch:
        """Run one batch through the store (writer thread)."""
        batch = Batch(cmds, keys, self.repeat_window, prune=time.monotonic() >= self._next_prune)
        self.store.run(batch)
        if batch.prune:
            self._pruned()
        return batch
