"""Opening SQLite, migrations and read-only connections, on real files."""

from __future__ import annotations

import sqlite3
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from fastapi_lith import MigrationError
from fastapi_lith.backends.sqlite.db import SqliteReaders, migrate, open_sqlite, user_version
from tests.support.browser import Server, ServerError


def write(folder: Path, name: str, sql: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(sql)


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_connection_pragmas(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "a.db", synchronous="FULL")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert open_sqlite(tmp_path / "b.db").execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_fresh_database_gets_every_migration(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    write(mig, "0002_b.sql", "CREATE TABLE b (id INTEGER PRIMARY KEY);")
    write(mig, "README.md", "not a migration")
    conn = open_sqlite(tmp_path / "app.db")
    assert migrate(conn, mig) == (0, 2)
    assert {"a", "b"} <= tables(conn)
    assert migrate(conn, mig) == (2, 2)  # idempotent


def test_incremental_migration_applies_only_the_new_ones(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY);")
    conn = open_sqlite(tmp_path / "app.db")
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
    conn = open_sqlite(tmp_path / "app.db")
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
    conn = open_sqlite(tmp_path / "app.db")
    conn.execute("PRAGMA user_version = 5")
    with pytest.raises(MigrationError, match="database version 5 is newer than the newest migration 1"):
        migrate(conn, mig)


def test_duplicate_numbers_are_refused(tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    write(mig, "0001_a.sql", "SELECT 1;")
    write(mig, "1_b.sql", "SELECT 1;")
    with pytest.raises(MigrationError, match="share version 1"):
        migrate(open_sqlite(tmp_path / "app.db"), mig)


async def test_readers_cannot_write(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "app.db")
    conn.execute("CREATE TABLE a (id INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO a VALUES (1)")
    readers = SqliteReaders(tmp_path / "app.db", size=2)
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
    conn = open_sqlite(tmp_path / "app.db")
    assert migrate(conn, mig) == (0, 2)
    assert migrate(conn, mig) == (2, 2)  # at the newest version: nothing to do, no error
    conn.execute("PRAGMA user_version = 3")  # written by a newer app
    with pytest.raises(MigrationError, match="database version 3 is newer than the newest migration 2"):
        migrate(conn, mig)


async def test_each_reader_thread_keeps_one_connection(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "app.db")
    conn.execute("CREATE TABLE t (x)")
    readers = SqliteReaders(tmp_path / "app.db", size=1)
    try:
        first = await readers.run(lambda db: db.conn)
        again = await readers.run(lambda db: db.conn)
        assert first is again and len(readers._conns) == 1  # opened once, reused
        assert await readers.run(lambda db: db.scalar("SELECT count(*) FROM t")) == 0
    finally:
        readers.close()
    assert readers._conns == []


def test_a_file_that_cannot_use_wal_is_refused_with_the_mode_it_got() -> None:
    from fastapi_lith import DatabaseError

    with pytest.raises(DatabaseError, match=r"^:memory:: could not switch to WAL mode \(got 'memory'\)$"):
        open_sqlite(":memory:")


def test_migration_files_are_found_by_their_number(tmp_path: Path) -> None:
    from fastapi_lith.engine.db import find_migrations

    mig = tmp_path / "migrations"
    write(mig, "0001_init.sql", "")
    write(mig, "0002-notes.txt", "")  # sorts between two migrations: skipped, not the end
    write(mig, "0002_b.sql", "")
    write(mig, "3.sql", "")  # a bare number is a migration too
    assert [(m.version, m.path.name) for m in find_migrations(mig)] == [(1, "0001_init.sql"), (2, "0002_b.sql"), (3, "3.sql")]
    with pytest.raises(MigrationError, match=r"^migrations folder .*missing does not exist$"):
        find_migrations(tmp_path / "missing")
    write(mig, "notes.sql", "")
    with pytest.raises(MigrationError, match=r"^migrations folder .*notes.sql is not a folder$"):
        find_migrations(mig / "notes.sql")
    (mig / "notes.sql").unlink()
    write(mig, "0000_zero.sql", "")
    with pytest.raises(MigrationError, match=r"^0000_zero.sql: migrations are numbered from 1$"):
        find_migrations(mig)


def test_a_relative_migrations_folder_that_is_missing_is_named_by_its_absolute_path(
    server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    """`migrations="migrations/"` follows the working directory: the error says which folder it looked in."""
    app = tmp_path / "app"
    write(app, "app.py", textwrap.dedent("""\
        from fastapi import FastAPI
        from fastapi_lith import Lith

        lith = Lith("app.db", migrations="migrations/")
        app = FastAPI(lifespan=lith.lifespan)
        lith.install(app)
    """))
    write(app / "migrations", "0001_init.sql", "CREATE TABLE t (id INTEGER PRIMARY KEY);")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(ServerError) as refused:
        server_factory("app:app", cwd=elsewhere, args=["--app-dir", str(app)])
    looked_in = elsewhere.resolve() / "migrations"
    assert f"migrations folder {looked_in} does not exist" in str(refused.value)
    assert 'Path(__file__).parent / "migrations"' in str(refused.value)  # and how to name it instead


def test_an_empty_migrations_folder_is_version_0(tmp_path: Path) -> None:
    from fastapi_lith.engine.db import pending_migrations

    (tmp_path / "migrations").mkdir()
    assert pending_migrations(tmp_path / "migrations", 0) == []
    with pytest.raises(MigrationError, match="database version 1 is newer than the newest migration 0"):
        pending_migrations(tmp_path / "migrations", 1)


def test_integers_out_of_sqlites_range_are_found_wherever_they_hide() -> None:
    from enum import IntEnum

    from fastapi_lith.engine.db import oversized_int

    class Big(IntEnum):
        HUGE = 2**70
        SMALL = 3

    assert oversized_int({"a": 1, "b": [2, 2**63]}) == 2**63
    assert oversized_int({-(2**63) - 1: "key"}) == -(2**63) - 1
    assert oversized_int((1, Big.HUGE)) == 2**70 and oversized_int([Big.SMALL, True, 1.5e300, "9" * 30, None]) is None


def test_a_db_without_a_cache_of_its_own_compiles_core_statements(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from fastapi_lith import Db

    table = sa.table("t", sa.column("a"), sa.column("b"))
    conn = open_sqlite(tmp_path / "a.db")
    conn.execute("CREATE TABLE t (a, b)")
    db = Db(conn)
    db.execute(table.insert(), {"a": 1, "b": 2})  # the columns come from the parameters
    db.execute(table.insert(), {"a": 3, "b": 4})
    assert [tuple(r) for r in db.all(sa.select(table.c.a, table.c.b).order_by(table.c.a))] == [(1, 2), (3, 4)]


async def test_threads_are_named_daemons_and_only_settled_calls_refuse_cancel(tmp_path: Path) -> None:
    import threading

    from fastapi_lith.engine.threads import Threads

    open_sqlite(tmp_path / "a.db").close()
    before = set(threading.enumerate())  # another test's pool may still be winding down
    readers = SqliteReaders(tmp_path / "a.db")
    try:
        mine = [t for t in threading.enumerate() if t not in before and t.name.startswith("lith-reader")]
        assert sorted(t.name for t in mine) == ["lith-reader-0", "lith-reader-1"] and all(t.daemon for t in mine)
    finally:
        readers.close()
    workers = Threads(1, "w")
    try:
        release = threading.Event()
        held = workers.submit(release.wait, 10)
        assert workers.submit(int).cancel() is True  # a read nobody waits for any more is dropped
        assert workers.submit(int, settled=True).cancel() is False  # a batch always lands
        release.set()
        assert await held is True
    finally:
        workers.close()


async def test_a_backends_readers_built_on_the_base_defaults_read_on_two_threads(tmp_path: Path) -> None:
    """`Readers()` as a new backend's subclass calls it, with no size of its own."""
    import threading

    from fastapi_lith.engine.db import Db
    from fastapi_lith.engine.readers import Readers

    class FileReaders(Readers):
        def _open(self) -> Db:
            return Db(open_sqlite(tmp_path / "a.db", read_only=True))

    open_sqlite(tmp_path / "a.db").close()
    before = set(threading.enumerate())  # another test's pool may still be winding down
    readers = FileReaders()
    try:
        mine = [t.name for t in threading.enumerate() if t not in before and t.name.startswith("lith-reader")]
        assert sorted(mine) == ["lith-reader-0", "lith-reader-1"]
        assert await readers.run(lambda db: db.scalar("PRAGMA query_only")) == 1
    finally:
        readers.close()
