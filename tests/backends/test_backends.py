"""`open_backend`: which backend a path or URL opens, and the parts each builds on its database."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, OperationalError

from fastapi_lith import SettingError, open_backend
from fastapi_lith.backends import PostgresBackend, SqliteBackend
from fastapi_lith.backends.postgres.db import PgReaders
from fastapi_lith.backends.postgres.feed import NotifyFeed
from fastapi_lith.backends.postgres.writer import PgWriter
from fastapi_lith.backends.sqlite.db import BUSY_TIMEOUT_MS, SqliteReaders
from fastapi_lith.backends.sqlite.feed import SqliteFeed
from fastapi_lith.backends.sqlite.writer import SqliteWriter


def reader_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("lith-reader")}


def test_a_path_opens_sqlite_and_each_postgresql_url_postgresql(tmp_path: Path) -> None:
    for url in ("postgresql://app@db/app", "postgresql+psycopg://app@db:5432/app", "postgres://app@db/app"):
        backend = open_backend(url)  # nothing connects yet
        assert isinstance(backend, PostgresBackend) and backend.name == "postgres"
        assert backend.url == url and backend.path is None
    for path in (tmp_path / "app.db", str(tmp_path / "app.db")):
        backend = open_backend(path)
        assert isinstance(backend, SqliteBackend) and backend.name == "sqlite"
        assert backend.path == tmp_path / "app.db" and backend.url is None
    with pytest.raises(SettingError, match=r"^unknown database URL mysql://: use a file path or postgresql\+psycopg://$"):
        open_backend("mysql://app@db/app?ssl_ca=https://ca.example/ca.pem")  # named by its scheme alone


def test_a_postgresql_url_without_psycopg_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastapi_lith.backends.postgres as package

    # What an install without the extra looks like: importing psycopg fails.
    for name in ("db", "writer"):
        monkeypatch.delitem(sys.modules, f"{package.__name__}.{name}")
        monkeypatch.delattr(package, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    said = r"^postgres URLs need psycopg: pip install 'fastapi-lith\[postgres\]' \(.*psycopg.*\)$"
    with pytest.raises(SettingError, match=said) as refused:
        open_backend("postgres://app@db:5432/app")  # named by its scheme alone
    assert isinstance(refused.value.__cause__, ImportError)


async def test_a_sqlite_backend_builds_every_part_on_its_file(tmp_path: Path) -> None:
    backend = open_backend(tmp_path / "app.db")
    feed = backend.feed()
    assert isinstance(feed, SqliteFeed) and feed.path == tmp_path / "app.db"
    writer = backend.writer(batch_size=7)
    assert isinstance(writer, SqliteWriter) and writer.path == tmp_path / "app.db" and writer.batch_size == 7
    before = reader_threads()
    readers = backend.readers(3)
    try:
        assert isinstance(readers, SqliteReaders) and readers.path == tmp_path / "app.db"
        assert len(reader_threads() - before) == 3
    finally:
        readers.close()
    with sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}").begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (x integer)"))
    # The handlers' engine reads the same file, waits on a lock as the readers do, and never writes.
    engine = backend.engine()
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(sa.text("SELECT count(*) FROM t"))).scalar() == 0
            assert (await conn.execute(sa.text("PRAGMA busy_timeout"))).scalar() == BUSY_TIMEOUT_MS
            with pytest.raises(OperationalError, match="readonly database"):
                await conn.execute(sa.text("INSERT INTO t VALUES (1)"))
    finally:
        await engine.dispose()


async def test_a_postgresql_backend_builds_every_part_on_its_database(pg_url: str) -> None:
    backend = open_backend(pg_url)
    assert isinstance(backend.feed(), NotifyFeed) and backend.feed().url == pg_url
    # Lith passes the file's settings to either backend: PostgreSQL leaves them out.
    writer = backend.writer(synchronous="FULL", wal_autocheckpoint=1000, batch_size=7)
    assert isinstance(writer, PgWriter) and writer.url == pg_url and writer.batch_size == 7
    assert isinstance(backend.writer(), PgWriter)
    before = reader_threads()
    readers = backend.readers(3)
    try:
        assert isinstance(readers, PgReaders) and readers.url == pg_url
        assert len(reader_threads() - before) == 3
    finally:
        readers.close()
    # The handlers' engine connects with the URL whole, its query too (a value may hold "://").
    engine = open_backend(pg_url + ("&" if "?" in pg_url else "?") + "application_name=lith://handlers").engine()
    try:
        async with engine.connect() as conn:
            name = psycopg.conninfo.conninfo_to_dict(pg_url.replace("+psycopg", ""))["dbname"]
            assert (await conn.execute(sa.text("SELECT current_database()"))).scalar() == name
            assert (await conn.execute(sa.text("SHOW application_name"))).scalar() == "lith://handlers"
            with pytest.raises(DBAPIError, match="read-only transaction"):
                await conn.execute(sa.text("CREATE TABLE t (x integer)"))
    finally:
        await engine.dispose()
