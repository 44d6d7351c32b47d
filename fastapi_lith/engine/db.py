"""Opening SQLite, migrations and the pool of read-only connections.

One file, WAL mode, one writer (see `writer.py`) and any number of readers. Readers are
`query_only`, so a GET handler that tries to write fails loudly instead of racing the writer.
"""

from __future__ import annotations

import asyncio
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy.sql import ClauseElement

from ..exceptions import DatabaseError, MigrationError, NotOneRow
from .statements import Params, Statement, StatementCache

T = TypeVar("T")
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
SYNCHRONOUS: tuple[str, ...] = ("OFF", "NORMAL", "FULL", "EXTRA")

# SQLite stores integers in 64 bits: a larger Python int makes sqlite3 raise OverflowError.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Readers wait this long for a checkpoint or a schema change instead of failing with SQLITE_BUSY.
BUSY_TIMEOUT_MS = 5000


def connect(
    path: str | Path,
    *,
    read_only: bool = False,
    synchronous: Synchronous = "NORMAL",
    cached_statements: int = 128,
) -> sqlite3.Connection:
    """Open one connection with the pragmas every connection of an app shares.

    `isolation_level=None` hands transaction control to us: the writer issues its own
    `BEGIN IMMEDIATE`, savepoints and `COMMIT`, and the sqlite3 module never begins one behind
    our back.
    """
    conn = sqlite3.connect(
        str(path),
        isolation_level=None,
        check_same_thread=False,
        cached_statements=cached_statements,
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    if not read_only:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise DatabaseError(f"{path}: could not switch to WAL mode (got {mode!r})")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    if read_only:
        conn.execute("PRAGMA query_only = ON")
    return conn


def oversized_int(value: Any) -> int | None:
    """The first int in `value` (nested in lists, dicts, models) that SQLite cannot store."""
    kind = type(value)
    if kind is int:
        return value if not INT64_MIN <= value <= INT64_MAX else None
    if kind is str or kind is float or kind is bool or value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        items: Iterable[Any] = value
    elif isinstance(value, dict):
        items = (*value.keys(), *value.values())
    elif hasattr(value, "__pydantic_fields__"):
        items = value.__dict__.values()
    elif isinstance(value, int):  # an int subclass: an IntEnum
        return oversized_int(int(value))
    else:
        return None
    for item in items:
        found = oversized_int(item)
        if found is not None:
            return found
    return None


class Db:
    """A connection with the statement cache and the usual row helpers.

    Views read through one (on a reader thread); commands write through its subclass `Tx`.
    Statements are SQLAlchemy Core objects, compiled once (see `statements.py`), or SQL strings
    with `:name` or `?` parameters. Rows are `sqlite3.Row`: index them or use column names.
    """

    __slots__ = ("conn", "_cursor", "_cache", "_compiled")

    def __init__(self, conn: sqlite3.Connection, cache: StatementCache | None = None) -> None:
        cache = cache if cache is not None else StatementCache()
        self.conn = conn
        # One cursor for every statement: a new cursor per statement costs more than the
        # statement itself (about 1.2 µs against 1 µs for a one-row UPDATE).
        self._cursor = conn.cursor()
        self._cache = cache
        self._compiled = cache.compiled

    def execute(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> sqlite3.Cursor:
        """Run one statement; the cursor gives `rowcount`, `lastrowid` and the rows.

        The cursor is shared: read it before the next statement, or use `all()`.
        """
        if stmt.__class__ is str:
            return self._cursor.execute(stmt, params or ())  # type: ignore[arg-type]
        entry = self._compiled.get(stmt)  # the common case in one lookup, without a call
        if entry.__class__ is not Statement:
            entry = self._cache.statement(stmt, params)  # type: ignore[arg-type]
        sql, values = entry.bind(params)  # type: ignore[union-attr, arg-type]
        return self._cursor.execute(sql, values)

    def executemany(self, stmt: ClauseElement | str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Run one statement for many parameter sets; returns the rows changed."""
        if isinstance(stmt, str):
            return self._cursor.executemany(stmt, rows).rowcount
        rows = list(rows)
        if not rows:
            return 0
        entry = self._cache.statement(stmt, rows[0])  # the rows share their keys, as in DB-API
        if entry.slow:  # expanding IN and the like: the SQL may differ from row to row
            return sum(self.execute(stmt, row).rowcount for row in rows)
        # One prepared statement for every row: 23% less than a loop of execute for 50 rows.
        return self._cursor.executemany(entry.sql, [entry.bind(row)[1] for row in rows]).rowcount

    def all(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> list[sqlite3.Row]:
        return self.execute(stmt, params).fetchall()

    def first(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> sqlite3.Row | None:
        return self.execute(stmt, params).fetchone()

    def one(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> sqlite3.Row:
        """Exactly one row, or `NotOneRow` (a `LookupError`): the usual guard for "this card must exist"."""
        rows = self.execute(stmt, params).fetchmany(2)
        if len(rows) != 1:
            raise NotOneRow(f"expected one row, got {'none' if not rows else 'several'}")
        return rows[0]

    def scalar(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> Any:
        """The first column of the first row, or None."""
        row = self.execute(stmt, params).fetchone()
        return None if row is None else row[0]


@dataclass(frozen=True)
class Migration:
    version: int
    path: Path


_NUMBERED = re.compile(r"^(\d+)[_\-.].*\.sql$|^(\d+)\.sql$")


def find_migrations(directory: str | Path) -> list[Migration]:
    """The numbered `.sql` files of a folder, in order; `0003_add_lanes.sql` is version 3."""
    folder = Path(directory)
    if not folder.is_dir():
        # A relative path follows the working directory, not the app's file: name the folder it
        # resolved to, which is where a service or a test runner started from another one looked.
        where = folder.resolve()
        problem = "is not a folder" if folder.exists() else "does not exist"
        hint = "" if folder.is_absolute() else (
            f' ({directory!s} is relative to the working directory; name it from the app\'s file:'
            ' Path(__file__).parent / "migrations")'
        )
        raise MigrationError(f"migrations folder {where} {problem}{hint}")
    found: dict[int, Path] = {}
    for path in sorted(folder.iterdir()):
        match = _NUMBERED.match(path.name)
        if not match:
            continue
        version = int(match.group(1) or match.group(2))
        if version == 0:
            raise MigrationError(f"{path.name}: migrations are numbered from 1")
        if version in found:
            raise MigrationError(f"{found[version].name} and {path.name} share version {version}")
        found[version] = path
    return [Migration(v, found[v]) for v in sorted(found)]


def pending_migrations(directory: str | Path, start: int) -> list[Migration]:
    """The migrations above version `start`, oldest first, for either backend; a database newer
    than the newest file is refused: an older app must not run against it."""
    migrations = find_migrations(directory)
    newest = migrations[-1].version if migrations else 0
    if start > newest:
        raise MigrationError(
            f"database version {start} is newer than the newest migration {newest} "
            f"in {Path(directory).name}: refusing to run an older app against it"
        )
    return [m for m in migrations if m.version > start]


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, directory: str | Path) -> tuple[int, int]:
    """Apply the migrations above the database's `user_version`, each in its own transaction.

    Returns the versions before and after. A failing file rolls back alone: the database stays
    at the last good version and the error names the file.
    """
    start = user_version(conn)
    for migration in pending_migrations(directory, start):
        sql = migration.path.read_text(encoding="utf-8")
        try:
            # executescript commits any open transaction first, then runs the script as is:
            # wrapping it in BEGIN/COMMIT makes the file and the version bump one transaction.
            conn.executescript(
                f"BEGIN IMMEDIATE;\n{sql}\n;PRAGMA user_version = {migration.version};\nCOMMIT;"
            )
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise MigrationError(
                f"migration {migration.path.name} failed: {exc}; "
                f"the database stays at version {user_version(conn)}"
            ) from exc
    return start, user_version(conn)


class Workers:
    """Threads that run blocking SQLite work for the event loop, one hop each way per call.

    Lighter than `run_in_executor`: a call is one `SimpleQueue.put` and its answer one
    `call_soon_threadsafe`, 46 µs a round trip against 75 µs through an executor here; the
    writer makes hundreds a second and the hub as many.
    """

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, fut, fn, args = item
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                loop.call_soon_threadsafe(_fail, fut, exc)
            else:
                loop.call_soon_threadsafe(_succeed, fut, result)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on one of the threads; an exception it raises is raised here."""
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., T], *args: Any, settled: bool = False) -> asyncio.Future[T]:
        """Queue `fn(*args)`; the future holds its outcome.

        With `settled`, the future cannot be cancelled: a task cancelled while awaiting it
        gets its `CancelledError` only once the outcome is in (see `Writer._run`).
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = _Settled(loop=loop) if settled else loop.create_future()
        self._queue.put((loop, fut, fn, args))
        return fut

    def close(self) -> None:
        """Finish the queued calls, then end the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()


class _Settled(asyncio.Future):  # type: ignore[type-arg]
    """A future that refuses `cancel()`: a task awaiting it is cancelled after it completes."""

    def cancel(self, msg: Any = None) -> bool:
        return False


def _succeed(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.cancelled():
        fut.set_result(result)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.cancelled():
        fut.set_exception(exc)


class Readers:
    """A pool of read-only connections, each owned by one thread.

    `await readers.run(fn)` calls `fn(db)` on a reader thread, in one read transaction, so
    everything `fn` reads shows one state. The sqlite3 module releases the GIL while SQLite
    works, so reads overlap the writer and the event loop. Another backend overrides how a
    connection opens, begins and rolls back (`backends/postgres.py`).
    """

    BEGIN = "BEGIN"

    def __init__(self, path: str | Path, *, size: int = 2, cached_statements: int = 128) -> None:
        self.path = Path(path)
        self._pool(size, cached_statements)

    def _pool(self, size: int, cached_statements: int) -> None:
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._cached_statements = cached_statements
        self._threads = Workers(size, "lith-reader")

    def _open(self) -> Db:
        conn = connect(self.path, read_only=True, cached_statements=self._cached_statements)
        return Db(conn, StatementCache(self._cached_statements))

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
