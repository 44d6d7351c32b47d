"""Opening SQLite, its migrations and its read-only connections.

One file, WAL mode, one writer (see `writer.py`) and any number of readers. Readers are
`query_only`, so a GET handler that tries to write fails loudly instead of racing the writer.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from ...engine.db import Db, pending_migrations
from ...engine.readers import Readers
from ...engine.statements import StatementCache
from ...exceptions import DatabaseError, MigrationError

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
SYNCHRONOUS: tuple[str, ...] = ("OFF", "NORMAL", "FULL", "EXTRA")
DEFAULT_SYNCHRONOUS: Synchronous = "NORMAL"  # durable in WAL mode but for the newest commits on power loss
WAL_AUTOCHECKPOINT = 1000  # SQLite's own default, in pages

# Readers wait this long for a checkpoint or a schema change instead of failing with SQLITE_BUSY.
BUSY_TIMEOUT_MS = 5000


def open_sqlite(
    path: str | Path,
    *,
    read_only: bool = False,
    synchronous: Synchronous = DEFAULT_SYNCHRONOUS,
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


class SqliteReaders(Readers):
    """`Readers` on one SQLite file: each connection `query_only`, each call one read transaction."""

    def __init__(self, path: str | Path, *, size: int = 2, cached_statements: int = 128) -> None:
        self.path = Path(path)
        super().__init__(size=size, cached_statements=cached_statements)

    def _open(self) -> Db:
        conn = open_sqlite(self.path, read_only=True, cached_statements=self._cached_statements)
        return Db(conn, StatementCache(self._cached_statements))
