"""The writer of one process on PostgreSQL: SQLite's batches, savepoints and outcomes, with
batches retried whole after a deadlock or a serialization failure (see `PgWriter`).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import psycopg

from .. import settings
from ..outcomes import TAB_KEEP, dump_outcome, load_outcome
from ..statements import StatementCache
from ..writer import Command, Topics, Writer
from .postgres import DIALECT, MIGRATION_LOCK, PgTx, connect, describe, find_folder, migrate, rollback

log = logging.getLogger("fastapi_lith.postgres")

# The transaction-scoped advisory lock that writers of all processes take turns on (see PgWriter).
WRITE_TURN = 0x6C697469

WRITER_NAME = "lith-writer"  # application_name of the write connection (pg_stat_activity)

# SQLSTATEs after which the whole batch runs again: serialization failure, deadlock.
RETRYABLE = frozenset({"40001", "40P01"})

OUTCOMES_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_outcome (key text PRIMARY KEY, at double precision NOT NULL, outcome bytea);
CREATE INDEX IF NOT EXISTS lith_outcome_at ON lith_outcome (at);
"""
# A keyed command claims its key before it applies: a second process sending the same key at
# the same moment waits on the row until the first commits, then finds it taken. (Looking first
# and inserting after, as on SQLite where one writer holds the file, would apply both.)
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


class PgWriter(Writer):
    """The writer of one process on PostgreSQL: SQLite's batches, savepoints and outcomes.

    With `take_turns` (the default) the writers of all processes take turns on an advisory
    lock held for each batch's transaction, as they take turns at the file on SQLite: batches of
    hundreds of commands touching rows in any order would otherwise deadlock each other, and
    PostgreSQL only notices a deadlock after `deadlock_timeout` (1 s by default). The lock goes
    with the transaction, so a process killed mid-batch releases it.

    `retries` bounds how often a batch runs again after a deadlock or serialization failure
    (with other clients of the database, or between writers that do not take turns), waiting a
    random 1 ms up to `backoff` seconds (doubling) between runs.
    """

    def __init__(
        self,
        url: str,
        *,
        migrations: str | Path | None = None,
        batch_size: int = 512,
        cached_statements: int = 512,
        statement_cache: bool = True,
        same_origin_only: bool = True,
        repeat_window: float = 3600.0,
        take_turns: bool = True,
        retries: int = 50,
        backoff: float = 0.1,
        feed: Any = None,
        **_sqlite_only: Any,  # synchronous, wal_autocheckpoint: SQLite's file settings
    ) -> None:
        super().__init__(
            url,
            migrations=migrations,
            batch_size=batch_size,
            cached_statements=cached_statements,
            statement_cache=statement_cache,
            same_origin_only=same_origin_only,
            repeat_window=repeat_window,
            feed=feed,
        )
        self.url = url
        self.take_turns = settings.flag("take_turns", take_turns)
        self.retries = settings.number("retries", retries, low=0, integer=True)
        self.backoff = settings.number("backoff", backoff, low=0.001)
        self.statements = StatementCache(
            cached_statements, enabled=settings.flag("statement_cache", statement_cache), dialect=DIALECT
        )
        self._prepared = max(cached_statements, 1)
        self._pg: psycopg.Connection[Any] | None = None
        self._committing = False  # COMMIT was sent: if the connection drops now, nobody knows
        self.reconnects = 0  # batches run again on a new connection after losing the old one
        self.retried = 0  # batches run again after a deadlock or serialization failure

    def _open(self) -> None:
        conn = connect(self.url, prepared=self._prepared, name=WRITER_NAME)
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                if self.migrations is not None:
                    before, after = migrate(conn, find_folder(self.migrations))
                    if after != before:
                        log.info("%s: migrated from version %d to %d", describe(self.url), before, after)
                conn.execute(OUTCOMES_SCHEMA.encode())
                conn.execute(TABS_SCHEMA.encode())
                self._prune(conn.cursor())
                self.feed.setup(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        except BaseException:
            conn.close()
            raise
        self._pg = conn

    def _prune(self, cur: Any) -> None:
        cur.execute(PRUNE_OUTCOMES, (time.time() - self.repeat_window,))
        cur.execute(PRUNE_TABS, (time.time() - TAB_KEEP,))
        self._next_prune = time.monotonic() + min(self.repeat_window, 3600.0) / 4

    def _close_conn(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def _apply(
        self, batch: list[Command], keys: list[str | None] | None
    ) -> tuple[list[Any], list[BaseException | None], Topics, int]:
        """Run the batch; after a deadlock or serialization failure, roll it back and run it
        again whole, so every command keeps its savepoint and its caller gets one answer."""
        delay = 0.001
        attempt = 0
        while True:
            if self._pg is None or self._pg.closed:
                self._pg = connect(self.url, prepared=self._prepared, name=WRITER_NAME)
            self._committing = False
            try:
                with self.feed.turn():
                    return self._transaction(batch, keys)
            except psycopg.OperationalError:
                # The connection dropped (a restart, a failover, a terminated backend). Before
                # COMMIT was sent nothing of the batch can have committed: run it again on a
                # new connection. During COMMIT the outcome is unknown: the callers hear so.
                if self._pg is None or not self._pg.closed or self._committing or attempt >= self.retries:
                    raise
                attempt += 1
                self.reconnects += 1
                log.warning("the write connection dropped; the batch of %d commands runs again", len(batch))
                time.sleep(min(delay, self.backoff))
                delay = min(delay * 2, self.backoff)
            except _Retry as exc:
                attempt += 1
                if attempt > self.retries:
                    raise exc.__cause__ or exc from None
                self.retried += 1
                log.debug("batch of %d commands runs again: %s", len(batch), exc.__cause__)
                time.sleep(random.uniform(0.001, delay))  # apart, so the two do not meet again
                delay = min(delay * 2, self.backoff)

    def _transaction(
        self, batch: list[Command], keys: list[str | None] | None
    ) -> tuple[list[Any], list[BaseException | None], Topics, int]:
        conn = self._pg
        assert conn is not None
        n = len(batch)
        results: list[Any] = [None] * n
        errors: list[BaseException | None] = [None] * n
        repeats = 0
        now = time.time()
        since = now - self.repeat_window
        tx = PgTx(conn, self.statements)  # type: ignore[arg-type]
        touched = tx._touched
        cur = conn.cursor()
        cur.execute("BEGIN")
        held = False  # a savepoint `cmd` is open
        try:
            if self.take_turns:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_TURN,), prepare=True)
            if keys is not None and time.monotonic() >= self._next_prune:
                self._prune(cur)
            for i in range(n):
                key = None if keys is None else keys[i]
                if key is not None and cur.execute(CLAIM_OUTCOME, (key, now, since), prepare=True).fetchone() is None:
                    row = cur.execute(FIND_OUTCOME, (key,), prepare=True).fetchone()
                    ok, value = load_outcome(None if row is None else row[0])
                    if ok:
                        results[i] = value
                    else:
                        errors[i] = value
                    repeats += 1
                    continue
                # One round trip: the previous command's savepoint released (COMMIT releases the
                # last one), this one's taken.
                cur.execute(b"RELEASE SAVEPOINT cmd; SAVEPOINT cmd" if held else b"SAVEPOINT cmd")
                held = True
                mark = len(touched)
                cmd = batch[i]
                try:
                    result = cmd.apply(tx)
                    cmd._settled(tx, None)
                except Exception as exc:
                    if retryable(exc):
                        raise _Retry(str(exc)) from exc
                    errors[i] = exc
                    del touched[mark:]
                    cur.execute("ROLLBACK TO SAVEPOINT cmd")
                    cmd._settled(tx, exc)
                    if key is not None:
                        cur.execute(RECORD_OUTCOME, (dump_outcome(False, exc), key), prepare=True)
                else:
                    results[i] = result
                    if key is not None and result is not None:
                        cur.execute(RECORD_OUTCOME, (dump_outcome(True, result), key), prepare=True)
            topics = frozenset(touched)
            self.feed.publish(conn, topics)  # NOTIFY: delivered to the listeners on COMMIT only
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
        return results, errors, topics, repeats
