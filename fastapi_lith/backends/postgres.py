"""PostgreSQL: the same commands and views on a server that any number of processes share.

What changes from SQLite is only how the database is opened and spoken to:

- the write connection: one per process, owned by the writer's thread. Each batch is one
  READ COMMITTED transaction with a SAVEPOINT per command, as on SQLite. Batches of different
  processes may deadlock; the loser's whole batch is rolled back and run again (see
  `PgWriter._apply`), so each caller still gets one answer and one process's commands keep their
  order;
- statements: compiled once for the PostgreSQL dialect by the statement cache, and prepared
  once per connection by psycopg (`prepare=True`);
- readers: a pool of connections, each view tick one REPEATABLE READ READ ONLY transaction, so
  every frame of a tick shows one state;
- migrations: numbered SQL files (a `postgres/` folder inside the app's migrations folder, if
  it has one), the version in the table `lith_schema`, each file in its own transaction, under
  an advisory lock so that processes starting at once migrate one after the other.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy import TextClause, text
from sqlalchemy.sql import ClauseElement

from .. import db, settings
from ..db import Db
from ..exceptions import MigrationError
from ..outcomes import TAB_KEEP, dump_outcome, load_outcome
from ..statements import Params, Statement, StatementCache
from ..writer import Command, Topics, Tx, Writer

log = logging.getLogger("fastapi_lith.postgres")
T = TypeVar("T")

# `format` (%s) is psycopg's placeholder, and positional like SQLite's `?`.
DIALECT = PGDialect_psycopg(paramstyle="format")

# The advisory lock taken while a process migrates and creates the library's tables.
MIGRATION_LOCK = 0x6C697468  # "lith"

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

SCHEMA_TABLE = "CREATE TABLE IF NOT EXISTS lith_schema (version integer NOT NULL)"


def is_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgresql+psycopg://", "postgres://"))


def dsn(url: str) -> str:
    """libpq's form of a SQLAlchemy URL: `postgresql+psycopg://` loses its driver name."""
    return "postgresql://" + url.split("://", 1)[1]


def describe(url: str) -> str:
    """The URL without its password, for logs and errors."""
    info = psycopg.conninfo.conninfo_to_dict(dsn(url))
    return f"postgresql database {info.get('dbname', '?')}"


class Row(tuple):  # type: ignore[type-arg]
    """A row indexed by position or column name, as `sqlite3.Row` is on SQLite."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        if key.__class__ is str:
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


_ROW_CLASSES: dict[tuple[str, ...], type[Row]] = {}


def lith_row(cursor: Any) -> Callable[[Sequence[Any]], Any]:
    """psycopg row factory: one `Row` class per column list, made once."""
    desc = cursor.description
    if desc is None:
        return tuple
    names = tuple(d.name for d in desc)
    cls = _ROW_CLASSES.get(names)
    if cls is None:
        cls = _ROW_CLASSES[names] = type("Row", (Row,), {"__slots__": (), "_index": {n: i for i, n in enumerate(names)}})
    return cls


def connect(url: str, *, prepared: int = 512, name: str = "lith") -> psycopg.Connection[Any]:
    """One connection in autocommit mode: the library writes its own BEGIN and COMMIT."""
    conn = psycopg.connect(dsn(url), autocommit=True, row_factory=lith_row, application_name=name)  # type: ignore[arg-type]
    conn.prepared_max = max(prepared, 1)
    return conn


_TEXTS: dict[str, TextClause] = {}


def _as_text(sql: str) -> TextClause:
    """A SQL string with `:name` parameters as SQLAlchemy's `text`, one object per string, so
    the statement cache compiles it once for PostgreSQL and the app's SQL runs on both."""
    clause = _TEXTS.get(sql)
    if clause is None:
        if len(_TEXTS) >= 1024:
            _TEXTS.clear()
        clause = _TEXTS[sql] = text(sql)
    return clause


class PgDb(Db):
    """`Db` over psycopg: compiled statements are prepared once per connection."""

    __slots__ = ()

    def execute(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> Any:
        if stmt.__class__ is str:
            if params is not None and not isinstance(params, Mapping):  # `%s` placeholders
                return self._cursor.execute(stmt, params)  # type: ignore[arg-type]
            stmt = _as_text(stmt)  # type: ignore[arg-type]  # `:name` placeholders, as on SQLite
        entry = self._compiled.get(stmt)
        if entry.__class__ is not Statement:
            entry = self._cache.statement(stmt, params)  # type: ignore[arg-type]
        sql, values = entry.bind(params)  # type: ignore[union-attr, arg-type]
        return self._cursor.execute(sql, values, prepare=True)

    def executemany(self, stmt: ClauseElement | str, rows: Iterable[Mapping[str, Any]]) -> int:
        if isinstance(stmt, str):
            cur = self._cursor
            cur.executemany(stmt, rows)  # type: ignore[arg-type]
            return cur.rowcount
        return sum(self.execute(stmt, row).rowcount for row in rows)


class PgTx(PgDb, Tx):
    """`Tx` over psycopg: what a command sees inside its savepoint."""

    __slots__ = ()


def find_folder(migrations: str | Path) -> Path:
    """The app's PostgreSQL migrations: `postgres/` inside its folder when there is one."""
    folder = Path(migrations)
    own = folder / "postgres"
    return own if own.is_dir() else folder


def schema_version(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT max(version) FROM lith_schema").fetchone()
    return int(row[0] or 0) if row else 0


def migrate(conn: psycopg.Connection[Any], directory: str | Path) -> tuple[int, int]:
    """Apply the files above the database's version, each in its own transaction.

    Call it under `MIGRATION_LOCK`. A failing file rolls back alone and the error names it; a
    database newer than the newest file is refused, as on SQLite.
    """
    conn.execute(SCHEMA_TABLE)
    start = schema_version(conn)
    for migration in db.pending_migrations(directory, start):
        sql = migration.path.read_text(encoding="utf-8")
        try:
            with conn.transaction():
                conn.execute(sql.encode())  # no parameters: the file may hold many statements
                conn.execute("DELETE FROM lith_schema")
                conn.execute("INSERT INTO lith_schema (version) VALUES (%s)", (migration.version,))
        except psycopg.Error as exc:
            raise MigrationError(
                f"migration {migration.path.name} failed: {exc}; "
                f"the database stays at version {schema_version(conn)}"
            ) from exc
    return start, schema_version(conn)


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
            _rollback(conn)
            if not isinstance(exc, _Retry) and retryable(exc):
                raise _Retry(str(exc)) from exc
            raise
        return results, errors, topics, repeats


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if conn.closed:
        return
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
    except psycopg.Error:
        log.warning("rollback failed; the connection is dropped", exc_info=True)
        conn.close()


class PgReaders:
    """A pool of read connections, each owned by one thread (see `db.Readers`).

    `await readers.run(fn)` calls `fn(db)` in one REPEATABLE READ READ ONLY transaction: the
    hub renders a whole tick through one call, so every frame of the tick shows one state.
    """

    def __init__(self, url: str, *, size: int = 2, cached_statements: int = 128) -> None:
        self.url = url
        self._local = threading.local()
        self._conns: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._cached_statements = cached_statements
        self._threads = db.Workers(size, "lith-reader")

    def _db(self) -> PgDb:
        pdb: PgDb | None = getattr(self._local, "db", None)
        if pdb is None or pdb.conn.closed:
            conn = connect(self.url, prepared=self._cached_statements)
            pdb = self._local.db = PgDb(conn, StatementCache(self._cached_statements, dialect=DIALECT))  # type: ignore[arg-type]
            with self._lock:
                self._conns.append(conn)
        return pdb

    def call(self, fn: Callable[[Db], T]) -> T:
        pdb = self._db()
        conn = pdb.conn
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")  # type: ignore[attr-defined]
        try:
            result = fn(pdb)
        except BaseException:
            _rollback(conn)  # type: ignore[arg-type]
            raise
        conn.execute("COMMIT")  # type: ignore[attr-defined]
        return result

    async def run(self, fn: Callable[[Db], T]) -> T:
        return await self._threads.run(self.call, fn)

    def close(self) -> None:
        self._threads.close()
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
