"""Where an app's data lives: a SQLite file on one host, or PostgreSQL for several.

A backend opens what `Lith` needs: the writer (with its write connection and migrations), the
readers, the default change feed and the engine of `Depends(lith.db)`. Everything else (commands,
views, the hub, streams) is the same on both. `open_backend` picks one from what the app passes:
a path is SQLite, a `postgresql+psycopg://` URL is PostgreSQL (needs `fastapi-lith[postgres]`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..engine.feed import Feed
from ..engine.readers import Readers
from ..engine.writer import Writer
from ..exceptions import SettingError
from .sqlite import db
from .sqlite.feed import SqliteFeed
from .sqlite.writer import SqliteWriter


class SqliteBackend:
    """One SQLite file: WAL, one writer per process, a table as the change feed."""

    name = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.url: str | None = None

    def feed(self) -> Feed:
        return SqliteFeed(self.path)

    def writer(self, **settings: Any) -> Writer:
        return SqliteWriter(self.path, **settings)

    def readers(self, size: int) -> Readers:
        return db.SqliteReaders(self.path, size=size)

    def engine(self) -> AsyncEngine:
        # aiosqlite for the handlers' ad hoc reads, every connection `query_only`.
        engine = create_async_engine(f"sqlite+aiosqlite:///{self.path}")

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA query_only = ON")
            cursor.close()

        return engine


class PostgresBackend:
    """A PostgreSQL database: a writer per process, NOTIFY as the change feed."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        try:
            from .postgres import db as postgres
            from .postgres import writer as pgwriter
        except ImportError as exc:  # psycopg missing
            raise SettingError(
                f"{url.split(':', 1)[0]} URLs need psycopg: pip install 'fastapi-lith[postgres]' ({exc})"
            ) from exc
        self._pg = postgres
        self._writer_module = pgwriter
        self.url = url
        self.path: Path | None = None

    def feed(self) -> Feed:
        from .postgres.feed import NotifyFeed

        return NotifyFeed(self.url)

    def writer(self, **settings: Any) -> Writer:
        for sqlite_only in ("synchronous", "wal_autocheckpoint"):  # the file's settings
            settings.pop(sqlite_only, None)
        return self._writer_module.PgWriter(self.url, **settings)

    def readers(self, size: int) -> Readers:
        return self._pg.PgReaders(self.url, size=size)

    def engine(self) -> AsyncEngine:
        from sqlalchemy.ext.asyncio import create_async_engine

        # Reads only, as the readers: a handler that tries to write fails loudly.
        return create_async_engine(
            "postgresql+psycopg://" + self.url.split("://", 1)[1],
            connect_args={"options": "-c default_transaction_read_only=on"},
        )


Backend = SqliteBackend | PostgresBackend


def open_backend(target: str | Path) -> Backend:
    """SQLite for a path, PostgreSQL for a `postgresql://` or `postgresql+psycopg://` URL."""
    if isinstance(target, str) and target.startswith(("postgresql:", "postgresql+psycopg:", "postgres:")):
        return PostgresBackend(target)
    if isinstance(target, str) and "://" in target:
        raise SettingError(f"unknown database URL {target.split('://', 1)[0]}://: use a file path or postgresql+psycopg://")
    return SqliteBackend(target)
