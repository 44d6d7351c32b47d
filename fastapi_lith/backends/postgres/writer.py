"""The writer of one process on PostgreSQL: `PgStore` runs each batch, `PgWriter` builds the writer.

SQLite's batches, savepoints and outcomes, with batches retried whole after a deadlock or a
serialization failure, and sent down a pipeline (see `PgStore`).
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psycopg

from ... import settings
from ...engine.commands import run_apply, settle
from ...engine.feed import Feed, LocalFeed
from ...engine.outcomes import TAB_KEEP
from ...engine.statements import StatementCache
from ...engine.store import Batch
from ...engine.writer import BATCH_SIZE, CACHED_STATEMENTS, REPEAT_WINDOW, Writer
from .db import (
    DIALECT,
    MIGRATION_LOCK,
    PgTx,
    describe,
    find_folder,
    migrate,
    open_postgres,
    rollback,
)
from .pipeline import Replay, WriterConnection, WriterCursor, deallocate_owed, forget_prepared

log = logging.getLogger("fastapi_lith.postgres")

# The transaction-scoped advisory lock that writers of all processes take turns on (see PgWriter).
WRITE_TURN = 0x6C697469

WRITER_NAME = "lith-writer"  # application_name of the write connection (pg_stat_activity)

# SQLSTATEs after which the whole batch runs again: serialization failure, deadlock.
RETRYABLE = frozenset({"40001", "40P01"})

# Pipeline mode needs libpq 14 (psycopg's binary wheels bring one). Without it every statement
# waits for the server, and a failed one raises where it was sent, as before the pipeline.
PIPELINE = psycopg.Pipeline.is_supported()

OUTCOMES_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_outcome (key text PRIMARY KEY, at double precision NOT NULL, outcome bytea);
CREATE INDEX IF NOT EXISTS lith_outcome_at ON lith_outcome (at);
"""
CLAIM_OUTCOME = (
    "INSERT INTO lith_outcome (key, at, outcome) VALUES (%s, %s, NULL) ON CONFLICT (key) DO UPDATE"
    " SET at = excluded.at, outcome = NULL WHERE lith_outcome.at < %s RETURNING 1"
)
FIND_OUTCOME = "SELECT outcome FROM lith_outcome WHERE key = %s"
RECORD_OUTCOME = "UPDATE lith_outcome SET outcome = %s WHERE key = %s"
PRUNE_OUTCOMES = "DELETE FROM lith_outcome WHERE at < %s"
# Each tab's latest outcome (see outcomes.py): the same table, in PostgreSQL's types.
TABS_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_tab (
    tab text PRIMARY KEY, op bigint NOT NULL, ok integer NOT NULL, message text, at double precision NOT NULL
);
"""
PRUNE_TABS = "DELETE FROM lith_tab WHERE at < %s"


def retryable(exc: BaseException) -> bool:
    """A deadlock or serialization failure, raised or wrapped by a command."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) in RETRYABLE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Retry(Exception):
    """The batch lost a deadlock or a serialization check: roll it back and run it again."""


class _Outcomes:
    """`lith_outcome` on PostgreSQL. A keyed command claims its key before it applies
    (`CLAIM_OUTCOME`): a second process sending the same key at the same moment waits on the row
    until the first commits, then finds it taken. (Looking first and inserting after, as on
    SQLite where one writer holds the file, would apply both.)"""

    __slots__ = ("cur",)

    def __init__(self, cur: Any) -> None:
        self.cur = cur

    def claim(self, key: str, now: float, since: float) -> tuple[bool, bytes | None]:
        if self.cur.execute(CLAIM_OUTCOME, (key, now, since), prepare=True).fetchone() is not None:
            return True, None
        row = self.cur.execute(FIND_OUTCOME, (key,), prepare=True).fetchone()
        return False, None if row is None else row[0]

    def record(self, key: str, now: float, outcome: bytes | None) -> None:
        if outcome is not None:  # the claim stored NULL, the outcome of a `None` result
            self.cur.execute(RECORD_OUTCOME, (outcome, key), prepare=True)


class PgStore:
    """The write connection of one process on PostgreSQL (a `Store`, see engine/store.py).

    With `take_turns` (the default) the writers of all processes take turns on an advisory
    lock held for each batch's transaction, as they take turns at the file on SQLite: batches of
    hundreds of commands touching rows in any order would otherwise deadlock each other, and
    PostgreSQL only notices a deadlock after `deadlock_timeout` (1 s by default). The lock goes
    with the transaction, so a process killed mid-batch releases it.

    `retries` bounds how often a batch runs again after a deadlock or serialization failure
    (with other clients of the database, or between writers that do not take turns), waiting a
    random 1 ms up to `backoff` seconds (doubling) between runs.

    A batch goes out in pipeline mode (see pipeline.py), first without savepoints: every
    command going through, or failing before it sent a statement, is the common case, and each
    SAVEPOINT and RELEASE costs the server a subtransaction. A command that fails after sending
    one (a read counts) has no savepoint to roll back to: the batch then runs again with a
    SAVEPOINT per command, as the next few batches do. A statement that fails there rolls back
    to its command's savepoint and that command runs again waiting on each statement, so its
    apply() meets the error where it occurs, as it would without the pipeline; what followed it
    in the pipeline is sent again.
    """

    dialect = DIALECT
    path: Path | None = None  # a server, not a file

    def __init__(
        self,
        url: str,
        *,
        migrations: str | Path | None = None,
        cached_statements: int = CACHED_STATEMENTS,
        take_turns: bool = True,
        retries: int = 50,
        backoff: float = 0.1,
    ) -> None:
        self.url = url
        self.migrations = migrations
        self.take_turns = settings.flag("take_turns", take_turns)
        self.retries = settings.number("retries", retries, low=0, integer=True)
        self.backoff = settings.number("backoff", backoff, low=0.001)
        self._prepared = max(cached_statements, 1)
        self._feed: Feed = LocalFeed()  # the writer's, from `open` on
        self._statements: StatementCache | None = None
        self._pg: WriterConnection | None = None
        self._fast_misses = 0  # batches in a row that had to run again with savepoints
        self._skip_fast = 0  # batches still to run with savepoints from the start
        self._committing = False  # COMMIT was sent: if the connection drops now, nobody knows
        # Per command of the running batch: tx.mark() as it began, and the cursors of
        # its SAVEPOINT and RELEASE, whose results say how far the server got.
        self._marks: list[int] = []
        self._opened: list[Any] = []
        self._closed: list[Any] = []
        self.reconnects = 0  # batches run again on a new connection after losing the old one
        self.retried = 0  # batches run again after a deadlock or serialization failure

    def describe(self) -> str:
        return describe(self.url)

    def _connect(self) -> WriterConnection:
        conn = open_postgres(self.url, prepared=self._prepared, name=WRITER_NAME, cls=WriterConnection)
        conn.cursor_factory = WriterCursor
        return conn

    def open(self, feed: Feed, statements: StatementCache, forget_before: float) -> None:
        self._feed, self._statements = feed, statements
        conn = self._connect()
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                if self.migrations is not None:
                    before, after = migrate(conn, find_folder(self.migrations))
                    if after != before:
                        log.info("%s: migrated from version %d to %d", describe(self.url), before, after)
                conn.execute(OUTCOMES_SCHEMA.encode())
                conn.execute(TABS_SCHEMA.encode())
                self._prune(conn.cursor(), forget_before)
                feed.setup(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        except BaseException:
            conn.close()
            raise
        self._pg = conn

    def _prune(self, cur: Any, forget_before: float) -> None:
        cur.execute(PRUNE_OUTCOMES, (forget_before,))
        cur.execute(PRUNE_TABS, (time.time() - TAB_KEEP,))

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def run(self, batch: Batch) -> None:
        """Run the batch; after a deadlock or serialization failure, roll it back and run it
        again whole, so every command keeps its savepoint and its caller gets one answer."""
        delay = 0.001
        attempt = 0
        while True:
            if self._pg is None or self._pg.closed:
                self._pg = self._connect()
            self._committing = False
            try:
                with self._feed.turn():
                    return self._transaction(batch)
            except psycopg.OperationalError:
                # The connection dropped (a restart, a failover, a terminated backend). Before
                # COMMIT was sent nothing of the batch can have committed: run it again on a
                # new connection. During COMMIT the outcome is unknown: the callers hear so.
                if self._pg is None or not self._pg.closed or self._committing or attempt >= self.retries:
                    raise
                attempt += 1
                self.reconnects += 1
                log.warning("the write connection dropped; the batch of %d commands runs again", len(batch.cmds))
                time.sleep(min(delay, self.backoff))
                delay = min(delay * 2, self.backoff)
            except _Retry as exc:
                attempt += 1
                if attempt > self.retries:
                    raise exc.__cause__ or exc from None
                self.retried += 1
                log.debug("batch of %d commands runs again: %s", len(batch.cmds), exc.__cause__)
                time.sleep(random.uniform(0.001, delay))  # apart, so the two do not meet again
                delay = min(delay * 2, self.backoff)

    def _transaction(self, b: Batch) -> None:
        conn, statements = self._pg, self._statements
        assert conn is not None and statements is not None
        tx = PgTx(conn, statements)
        cur = tx.cursor
        self._begin(b, tx)
        try:
            careful = True
            if self._skip_fast:
                self._skip_fast -= 1
            elif self._pipelined(b, tx, 0, savepoints=False) is None:
                careful = False
                self._fast_misses = 0
            else:
                # A command failed after sending a statement: run the batch again, with savepoints.
                # While that keeps happening, batches go straight to savepoints, ever longer.
                self._fast_misses = min(2 * self._fast_misses or 1, 64)
                self._skip_fast = self._fast_misses
                rollback(conn)
                self._begin(b, tx)
            start = 0
            while careful and (failed := self._pipelined(b, tx, start)) is not None:
                # A statement of this command failed: back to its savepoint, and it runs again
                # waiting on each statement, so that its apply() meets the error where it occurs.
                cur.execute(b"ROLLBACK TO SAVEPOINT cmd")
                tx.forget_since(self._marks[failed])
                self._command(b, tx, failed, again=True)
                start = failed + 1
            topics = b.topics = tx.touched_topics()
            self._feed.publish(conn, topics)  # NOTIFY: delivered to the listeners on COMMIT only
            self._committing = True
            try:
                cur.execute("COMMIT")
            except psycopg.Error as exc:
                if retryable(exc):
                    raise _Retry(str(exc)) from exc
                raise
        except BaseException as exc:
            rollback(conn)
            if not isinstance(exc, _Retry) and retryable(exc):
                raise _Retry(str(exc)) from exc
            raise

    def _begin(self, b: Batch, tx: PgTx) -> None:
        """Every answer and topic forgotten: the batch runs (again) from its first command."""
        b.reset()
        n = len(b.cmds)
        self._marks, self._opened, self._closed = [0] * n, [None] * n, [None] * n
        tx.forget_since(0)
        if b.keys is not None:
            b.outcomes = _Outcomes(tx.cursor)

    def _pipelined(self, b: Batch, tx: PgTx, start: int, savepoints: bool = True) -> int | None:
        """Send the commands from `start` on without waiting for the server (psycopg's pipeline
        mode), then one Sync. None if all went through. Else, with savepoints, the index of the
        command whose statement failed: the server skipped all that was sent after it, and the
        transaction is in error until rolled back to that savepoint; without, -1."""
        conn = self._pg
        assert conn is not None
        error: psycopg.Error | None = None
        lost = False  # a command failed after sending a statement, and there is no savepoint
        try:
            with conn.pipeline() if PIPELINE else nullcontext():
                try:
                    if start == 0:
                        cur = tx.cursor
                        cur.execute("BEGIN")
                        if self.take_turns:
                            cur.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_TURN,), prepare=True)
                        if b.prune:
                            self._prune(cur, b.since)
                    for i in range(start, len(b.cmds)):
                        if not self._command(b, tx, i, savepoint=savepoints):
                            lost = True
                            break
                except Replay as exc:
                    error = exc.error
        except psycopg.Error as exc:  # from the Sync as the pipeline ends
            error = error or exc
        if error is None:
            deallocate_owed(conn)  # in error, the ROLLBACK (TO SAVEPOINT) that follows does it
            if not lost:
                return None
        else:
            forget_prepared(conn)
        if error is not None and (conn.closed or retryable(error)):
            raise error
        if not savepoints:
            return -1
        # The command whose SAVEPOINT went through and RELEASE did not holds the failure; none
        # such: it was in the batch's own statements (BEGIN, a key's claim): the batch fails.
        for i in range(len(b.cmds) - 1, start - 1, -1):
            opened, closed = self._opened[i], self._closed[i]
            if opened is not None and opened.pgresult is not None:
                if closed is None or closed.pgresult is None:
                    return i
                break
        raise error  # type: ignore[misc]

    def _command(self, b: Batch, tx: PgTx, i: int, savepoint: bool = True, again: bool = False) -> bool:
        """Apply command `i`, in its savepoint unless `savepoint` is false; `again` after its
        statement failed in the pipeline: the savepoint is there, the key claimed, and the
        statements wait. False if it failed after sending a statement, without a savepoint."""
        conn, cur, cmd = self._pg, tx.cursor, b.cmds[i]
        assert isinstance(conn, WriterConnection)
        key = None if b.keys is None else b.keys[i]
        if not again:
            self._opened[i] = self._closed[i] = None
            if key is not None and b.repeat(i, key):
                return True
            if savepoint:
                self._opened[i] = conn.cursor().execute(b"SAVEPOINT cmd")
            self._marks[i] = tx.mark()
        sent = conn.sent
        try:
            result = run_apply(cmd, tx)
            settle(cmd, tx, None)
        except Exception as exc:
            if retryable(exc):
                raise _Retry(str(exc)) from exc
            if not savepoint and conn.sent != sent:
                return False
            b.results[i], b.errors[i] = None, exc
            tx.forget_since(self._marks[i])
            if savepoint:
                cur.execute(b"ROLLBACK TO SAVEPOINT cmd")
            settle(cmd, tx, exc)
            if key is not None:
                b.record(i, key)
        else:
            b.results[i], b.errors[i] = result, None
            if key is not None:
                b.record(i, key)
        if savepoint:
            self._closed[i] = conn.cursor().execute(b"RELEASE SAVEPOINT cmd")
        return True


class PgWriter(Writer):
    """The writer of one process on PostgreSQL: a `Writer` over a `PgStore` (whose settings
    `take_turns`, `retries` and `backoff` are). Without a `feed`, this process alone writes
    (`LocalFeed`); Lith passes a `NotifyFeed`."""

    @settings.checked()
    def __init__(
        self,
        url: str,
        *,
        migrations: str | Path | None = None,
        batch_size: int = BATCH_SIZE,
        cached_statements: int = CACHED_STATEMENTS,
        statement_cache: bool = True,
        repeat_window: float = REPEAT_WINDOW,
        take_turns: bool = True,
        retries: int = 50,
        backoff: float = 0.1,
        feed: Feed | None = None,
    ) -> None:
        store = PgStore(
            url,
            migrations=migrations,
            cached_statements=cached_statements,
            take_turns=take_turns,
            retries=retries,
            backoff=backoff,
        )
        super().__init__(
            store,
            feed=feed,
            batch_size=batch_size,
            cached_statements=cached_statements,
            statement_cache=statement_cache,
            repeat_window=repeat_window,
        )
        self.store: PgStore = store
        self.url = url

    @property
    def reconnects(self) -> int:
        """Batches run again on a new connection after losing the old one."""
        return self.store.reconnects

    @property
    def retried(self) -> int:
        """Batches run again after a deadlock or a serialization failure."""
        return self.store.retried
