"""The writer of one SQLite file: `SqliteStore` runs each batch, `SqliteWriter` builds the writer.

A batch is one `BEGIN IMMEDIATE` transaction, in this process's turn at the file (see
`Feed.turn`), with a `SAVEPOINT` per command: a failing command rolls back to it alone. Every
statement waits for SQLite, so a command's `apply` meets an error where it occurs.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from ... import settings
from ...engine.commands import run_apply, settle
from ...engine.feed import Feed, LocalFeed
from ...engine.outcomes import (
    FIND_OUTCOME,
    OUTCOMES_SCHEMA,
    PRUNE_OUTCOMES,
    PRUNE_TABS,
    RECORD_OUTCOME,
    TAB_KEEP,
    TABS_SCHEMA,
)
from ...engine.statements import DIALECT, StatementCache
from ...engine.storage import storage_cause
from ...engine.store import Batch
from ...engine.tx import Tx
from ...engine.writer import BATCH_SIZE, CACHED_STATEMENTS, REPEAT_WINDOW, Writer
from . import db

log = logging.getLogger("fastapi_lith.writer")
# How long a closing writer waits for the file to run `PRAGMA optimize`: a shutdown is not held
# for a hint.
OPTIMIZE_WAIT_MS = 100


class _Outcomes:
    """`lith_outcome` on SQLite: one writer holds the file, so looking first and inserting after
    cannot race another process's writer."""

    __slots__ = ("cur",)

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.cur = cur

    def claim(self, key: str, now: float, since: float) -> tuple[bool, bytes | None]:
        row = self.cur.execute(FIND_OUTCOME, (key, since)).fetchone()
        return (True, None) if row is None else (False, row[0])

    def record(self, key: str, now: float, outcome: bytes | None) -> None:
        # Even a `None` outcome: the row itself says the command applied.
        self.cur.execute(RECORD_OUTCOME, (key, now, outcome))


class SqliteStore:
    """One SQLite file's write connection (a `Store`, see engine/store.py)."""

    dialect = DIALECT

    def __init__(
        self,
        path: str | Path,
        *,
        migrations: str | Path | None = None,
        synchronous: db.Synchronous = db.DEFAULT_SYNCHRONOUS,
        cached_statements: int = CACHED_STATEMENTS,
        wal_autocheckpoint: int = db.WAL_AUTOCHECKPOINT,
    ) -> None:
        self.path = Path(path)
        self.migrations = migrations
        self.synchronous: db.Synchronous = settings.choice("synchronous", synchronous, db.SYNCHRONOUS)  # type: ignore[assignment]
        self.cached_statements = cached_statements
        # SQLite's default; raised while Litestream replicates, since it checkpoints itself.
        self.wal_autocheckpoint = wal_autocheckpoint
        self._conn: sqlite3.Connection | None = None
        self._feed: Feed = LocalFeed()  # the writer's, from `open` on
        self._statements: StatementCache | None = None

    def describe(self) -> str:
        return self.path.name

    def open(self, feed: Feed, statements: StatementCache, forget_before: float) -> None:
        self._feed, self._statements = feed, statements
        # Processes starting at once take turns: switching a new file to WAL and migrating
        # both want the file to themselves.
        with feed.turn():
            conn = db.open_sqlite(
                self.path,
                synchronous=self.synchronous,
                cached_statements=self.cached_statements if statements.enabled else 0,
            )
            try:
                conn.execute(f"PRAGMA wal_autocheckpoint = {int(self.wal_autocheckpoint)}")
                if self.migrations is not None:
                    before, after = db.migrate(conn, self.migrations)
                    if after != before:
                        log.info("%s: migrated from version %d to %d", self.path.name, before, after)
                conn.executescript(f"BEGIN IMMEDIATE;{OUTCOMES_SCHEMA};{TABS_SCHEMA};COMMIT;")
                self._prune(conn.cursor(), forget_before)
                feed.setup(conn)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.close()
                raise
        self._conn = conn

    def _prune(self, cur: sqlite3.Cursor, forget_before: float) -> None:
        """Forget outcomes older than the window (in the caller's transaction, if any)."""
        cur.execute(PRUNE_OUTCOMES, (forget_before,))
        cur.execute(PRUNE_TABS, (time.time() - TAB_KEEP,))

    def close(self) -> None:
        if self._conn is None:
            return
        # `optimize` may write the planner's statistics: in this process's turn, like a batch,
        # and only a hint, skipped when another process holds the file (a worker's own close).
        # The next close runs it.
        try:
            with self._feed.turn():
                self._conn.execute(f"PRAGMA busy_timeout = {OPTIMIZE_WAIT_MS}")
                self._conn.execute("PRAGMA optimize")
        except sqlite3.OperationalError as exc:
            log.info("%s: PRAGMA optimize skipped at close: %s", self.path, exc)
        self._conn.close()
        self._conn = None

    def run(self, batch: Batch) -> None:
        """Run the batch in this process's turn at the file (see `Feed.turn`)."""
        with self._feed.turn():
            try:
                self._transaction(batch)
            except BaseException:  # a full disk in a command, or at any statement of the batch
                if self._conn is not None and self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")  # else the next batch's BEGIN would fail
                raise

    def _transaction(self, batch: Batch) -> None:
        """One transaction, each command in its own savepoint.

        A keyed command with an outcome in the window answers with it instead of applying (see
        `Batch.repeat`); a new one records its outcome in the command's savepoint, or after
        rolling the command back, so both commit together.
        """
        conn, statements = self._conn, self._statements
        assert conn is not None and statements is not None
        cmds, keys, errors = batch.cmds, batch.keys, batch.errors
        pending: Any = range(len(cmds))
        while True:
            results = batch.results
            tx = Tx(conn, statements)
            cur = conn.cursor()
            if keys is not None:
                batch.outcomes = _Outcomes(cur)
            lost = None
            cur.execute("BEGIN IMMEDIATE")
            if batch.prune:
                self._prune(cur, batch.since)
            for i in pending:
                key = None if keys is None else keys[i]
                if key is not None and batch.repeat(i, key):
                    continue
                cur.execute("SAVEPOINT cmd")
                mark = tx.mark()
                cmd = cmds[i]
                try:
                    result = run_apply(cmd, tx)
                    settle(cmd, tx, None)
                    results[i] = result
                    if key is not None:
                        batch.record(i, key)
                except Exception as exc:
                    if storage_cause(exc) is not None:
                        raise  # the disk's fault, not the command's: the whole batch fails
                    errors[i] = exc
                    tx.forget_since(mark)
                    if not conn.in_transaction:  # SQLite rolled the whole transaction back
                        lost = i
                        break
                    cur.execute("ROLLBACK TO cmd")
                    cur.execute("RELEASE cmd")
                    settle(cmd, tx, exc)
                    if key is not None:
                        batch.record(i, key)
                else:
                    cur.execute("RELEASE cmd")
            if lost is None:
                try:  # whatever fails here, the transaction must not stay open for the next batch
                    topics = batch.topics = tx.touched_topics()
                    self._feed.publish(conn, topics)  # other processes' hubs read it once committed
                    cur.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return
            # Rare: an error that ends the transaction (an interrupted statement; a full disk
            # failed the batch above). The command that caused it keeps its error; the others
            # run again from the start.
            batch.reset(keep_errors=True)
            pending = batch.pending()


class SqliteWriter(Writer):
    """The writer of one SQLite file: `fastapi_lith.Writer`.

    `synchronous` is SQLite's (NORMAL: a process crash loses nothing, a power loss may lose
    the newest commits; FULL: neither), `wal_autocheckpoint` its pages between checkpoints.
    Without a `feed`, this process alone writes the file (`LocalFeed`).
    """

    @settings.checked()
    def __init__(
        self,
        path: str | Path,
        *,
        migrations: str | Path | None = None,
        synchronous: db.Synchronous = db.DEFAULT_SYNCHRONOUS,
        batch_size: int = BATCH_SIZE,
        cached_statements: int = CACHED_STATEMENTS,
        statement_cache: bool = True,
        repeat_window: float = REPEAT_WINDOW,
        wal_autocheckpoint: int = db.WAL_AUTOCHECKPOINT,
        feed: Feed | None = None,
    ) -> None:
        store = SqliteStore(
            path,
            migrations=migrations,
            synchronous=synchronous,
            cached_statements=cached_statements,
            wal_autocheckpoint=wal_autocheckpoint,
        )
        super().__init__(
            store,
            feed=feed,
            batch_size=batch_size,
            cached_statements=cached_statements,
            statement_cache=statement_cache,
            repeat_window=repeat_window,
        )
        self.store: SqliteStore = store

    @property
    def wal_autocheckpoint(self) -> int:
        """Pages between checkpoints; Lith raises it while Litestream replicates (set before start)."""
        return self.store.wal_autocheckpoint

    @wal_autocheckpoint.setter
    def wal_autocheckpoint(self, pages: int) -> None:
        self.store.wal_autocheckpoint = pages

    @property
    def migrations(self) -> str | Path | None:
        return self.store.migrations

    @property
    def synchronous(self) -> str:
        return self.store.synchronous
