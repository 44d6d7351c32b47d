"""PostgreSQL: the same commands and views on a server that any number of processes share.

What changes from SQLite is only how the database is opened and spoken to:

- the write connection: one per process, owned by the writer's thread. Each batch is one
  READ COMMITTED transaction with a SAVEPOINT per command, as on SQLite. Batches of different
  processes may deadlock; the loser's whole batch is rolled back and run again (see
  writer.py), so each caller still gets one answer and one process's commands keep their
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy import TextClause, text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.sql import ClauseElement

from ...engine.db import Db, pending_migrations
from ...engine.readers import Readers
from ...engine.statements import Params, Statement, StatementCache
from ...engine.tx import Tx
from ...exceptions import MigrationError

log = logging.getLogger("fastapi_lith.postgres")
T = TypeVar("T")
C = TypeVar("C", bound="psycopg.Connection[Any]")

# `format` (%s) is psycopg's placeholder, and positional like SQLite's `?`.
DIALECT = PGDialect_psycopg(paramstyle="format")  # type: ignore[no-untyped-call]  # SQLAlchemy leaves its __init__ unannotated

# The advisory lock taken while a process migrates and creates the library's tables.
MIGRATION_LOCK = 0x6C697468  # "lith"

SCHEMA_TABLE = "CREATE TABLE IF NOT EXISTS lith_schema (version integer NOT NULL)"


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
        index = {n: i for i, n in enumerate(names)}
        cls = _ROW_CLASSES[names] = type("Row", (Row,), {"__slots__": (), "_index": index})
    return cls


def open_postgres(url: str, *, prepared: int = 512, name: str = "lith", cls: type[C] = psycopg.Connection) -> C:  # type: ignore[assignment]
    """One connection in autocommit mode: the library writes its own BEGIN and COMMIT."""
    conn = cls.connect(dsn(url), autocommit=True, row_factory=lith_row, application_name=name)
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
        if isinstance(stmt, str):
            if params is not None and not isinstance(params, Mapping):  # `%s` placeholders
                return self._cursor.execute(stmt, params)
            stmt = _as_text(stmt)  # `:name` placeholders, as on SQLite
        entry = self._compiled.get(stmt)
        if entry.__class__ is not Statement:
            entry = self._cache.statement(stmt, params)  # type: ignore[arg-type]
        sql, values = entry.bind(params)  # type: ignore[arg-type]
        return self._cursor.execute(sql, values, prepare=True)

    def executemany(self, stmt: ClauseElement | str, rows: Iterable[Mapping[str, Any]]) -> int:
        if isinstance(stmt, str):
            # A cursor of its own: psycopg adds to the count every result the cursor takes in
            # meanwhile, and in the writer's pipeline those of the statements sent before it on
            # the shared cursor are still to come.
            cur = self.conn.cursor()
            cur.executemany(stmt, rows)
            changed: int = cur.rowcount
            return changed
        return sum(self.execute(stmt, row).rowcount for row in rows)


class PgTx(Tx):
    """`Tx` over psycopg: what a command sees inside its savepoint. Its statements run as
    `PgDb`'s do (the same two functions, not a second base class)."""

    __slots__ = ()
    execute = PgDb.execute
    executemany = PgDb.executemany


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
    for migration in pending_migrations(directory, start):
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


def rollback(conn: psycopg.Connection[Any]) -> None:
    if conn.closed:
        return
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
    except psycopg.Error:
        log.warning("rollback failed; the connection is dropped", exc_info=True)
        conn.close()


class PgReaders(Readers):
    """`Readers` on PostgreSQL: each call one REPEATABLE READ READ ONLY transaction, so the
    hub's tick, rendered through one call, shows one state in every frame."""

    BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    def __init__(self, url: str, *, size: int = 2, cached_statements: int = 128) -> None:
        self.url = url
        super().__init__(size=size, cached_statements=cached_statements)

    def _open(self) -> PgDb:
        conn: psycopg.Connection[Any] = open_postgres(self.url, prepared=self._cached_statements)
        return PgDb(conn, StatementCache(self._cached_statements, dialect=DIALECT))

    def _usable(self, db: Db) -> bool:
        return not db.conn.closed

    def _rollback(self, conn: Any) -> None:
        rollback(conn)
