"""Opening SQLite, migrations and read-only connections, on real files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fastapi_lith import MigrationError
from fastapi_lith.db import Readers, connect, migrate, user_version


def write(folder: Path, name: str, sql: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(sql)


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_connection_pragmas(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.db", synchronous="FULL")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert connect(tmp_path / "b.db").execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_fresh_database_gets_every_migration(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    write(mig, "0002_b.sql", "CREATE TABLE b (id INTEGER PRIMARY KEY);")
    write(mig, "README.md", "not a migration")
    conn = connect(tmp_path / "app.db")
    assert migrate(conn, mig) == (0, 2)
    assert {"a", "b"} <= tables(conn)
    assert migrate(conn, mig) == (2, 2)  # idempotent


def test_incremental_migration_applies_only_the_new_ones(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    conn = connect(tmp_path / "app.db")
    migrate(conn, mig)
    conn.execute("INSERT INTO a VALUES (7)")
    write(mig, "0002_col.sql", "ALTER TABLE a ADD COLUMN name TEXT NOT NULL DEFAULT 'x';")
    assert migrate(conn, mig) == (1, 2)
    assert [tuple(r) for r in conn.execute("SELECT id, name FROM a")] == [(7, "x")]


def test_failing_migration_stays_at_last_good_version(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    write(mig, "0002_ok.sql", "CREATE TABLE b (id INTEGER PRIMARY KEY);")
    write(mig, "0003_bad.sql", "CREATE TABLE c (id INTEGER PRIMARY KEY);\nSELEKT nonsense;")
    conn = connect(tmp_path / "app.db")
    with pytest.raises(MigrationError) as err:
        migrate(conn, mig)
    assert "0003_bad.sql" in str(err.value) and "syntax error" in str(err.value)
    assert "version 2" in str(err.value)
    assert user_version(conn) == 2
    assert "c" not in tables(conn)  # the bad file's first statement rolled back with it
    assert not conn.in_transaction


def test_newer_database_is_refused(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    conn = connect(tmp_path / "app.db")
    conn.execute("PRAGMA user_version = 5")
    with pytest.raises(MigrationError, match="database version 5 is newer than the newest migration 1"):
        migrate(conn, mig)


def test_duplicate_numbers_are_refused(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_a.sql", "SELECT 1;")
    write(mig, "1_b.sql", "SELECT 1;")
    with pytest.raises(MigrationError, match="share version 1"):
        migrate(connect(tmp_path / "app.db"), mig)


async def test_readers_cannot_write(tmp_path: Path) -> None:
    conn = connect(tmp_path / "app.db")
    conn.execute("CREATE TABLE a (id INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO a VALUES (1)")
    readers = Readers(tmp_path / "app.db", size=2)
    try:
        assert await readers.run(lambda db: db.execute("SELECT id FROM a").fetchone()["id"]) == 1
        with pytest.raises(sqlite3.OperationalError, match="readonly|query_only|attempt to write"):
            await readers.run(lambda db: db.execute("INSERT INTO a VALUES (2)"))
        # The failed write left the reader usable and wrote nothing.
        assert await readers.run(lambda db: db.execute("SELECT count(*) FROM a").fetchone()[0]) == 1
    finally:
        readers.close()


def test_a_database_one_version_ahead_is_refused_and_the_newest_is_not(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    write(mig, "0002_more.sql", "CREATE TABLE b (id INTEGER PRIMARY KEY);")
    conn = connect(tmp_path / "app.db")
    assert migrate(conn, mig) == (0, 2)
    assert migrate(conn, mig) == (2, 2)  # at the newest version: nothing to do, no error
    conn.execute("PRAGMA user_version = 3")  # written by a newer app
    with pytest.raises(MigrationError, match="database version 3 is newer than the newest migration 2"):
        migrate(conn, mig)


async def test_each_reader_thread_keeps_one_connection(tmp_path: Path) -> None:
    conn = connect(tmp_path / "app.db")
    conn.execute("CREATE TABLE t (x)")
    readers = Readers(tmp_path / "app.db", size=1)
    try:
        first = await readers.run(lambda db: db.conn)
        again = await readers.run(lambda db: db.conn)
        assert first is again and len(readers._conns) == 1  # opened once, reused
        assert await readers.run(lambda db: db.scalar("SELECT count(*) FROM t")) == 0
    finally:
        readers.close()
    assert readers._conns == []
