"""The statement cache gives SQLite the same SQL and parameters SQLAlchemy itself would."""

from __future__ import annotations

import datetime as dt
import sqlite3

import sqlalchemy as sa

from fastapi_lith.engine.statements import StatementCache

metadata = sa.MetaData()
items = sa.Table(
    "items",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text),
    sa.Column("done", sa.Boolean),
    sa.Column("at", sa.DateTime),
)


def run(cache: StatementCache, conn: sqlite3.Connection, stmt, params=None) -> list[tuple]:
    sql, values = cache.bind(stmt, params)
    return conn.execute(sql, values).fetchall()


def make() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, done INTEGER, at TEXT)")
    return conn


def test_compiles_once_per_statement() -> None:
    cache, conn = StatementCache(), make()
    insert = items.insert().values(name=sa.bindparam("name"), done=False)
    for i in range(10):
        run(cache, conn, insert, {"name": f"n{i}"})
    assert cache.misses == 1 and len(cache) == 1
    assert run(cache, conn, sa.select(sa.func.count()).select_from(items)) == [(10,)]


def test_literal_defaults_types_and_expanding_in() -> None:
    cache, conn = StatementCache(), make()
    when = dt.datetime(2026, 1, 2, 3, 4, 5)
    run(cache, conn, items.insert(), {"id": 1, "name": "a", "done": True, "at": when})
    run(cache, conn, items.insert(), {"id": 2, "name": "b"})  # other columns: another variant
    assert conn.execute("SELECT id, name, done, at FROM items").fetchall() == [
        (1, "a", 1, "2026-01-02 03:04:05.000000"),
        (2, "b", None, None),
    ]
    by_ids = sa.select(items.c.name).where(items.c.id.in_(sa.bindparam("ids", expanding=True)))
    assert run(cache, conn, by_ids, {"ids": [1, 2]}) == [("a",), ("b",)]
    assert run(cache, conn, by_ids, {"ids": [2]}) == [("b",)]
    fixed = sa.select(items.c.name).where(items.c.id == 2)  # a literal bound at build time
    assert run(cache, conn, fixed) == [("b",)]
    later = sa.select(items.c.id).where(items.c.at > sa.bindparam("t", type_=sa.DateTime))
    assert run(cache, conn, later, {"t": dt.datetime(2026, 1, 1)}) == [(1,)]


def test_missing_parameter_names_it() -> None:
    cache = StatementCache()
    stmt = items.update().where(items.c.id == sa.bindparam("card")).values(name=sa.bindparam("title"))
    try:
        cache.bind(stmt, {"title": "x"})
    except KeyError as exc:
        assert "card" in str(exc)
    else:
        raise AssertionError("a missing parameter must raise")


def test_bounded_and_off() -> None:
    cache = StatementCache(size=4)
    for i in range(10):
        cache.bind(sa.select(items.c.id).where(items.c.id == i), None)
    assert len(cache) == 4
    off = StatementCache(enabled=False)
    assert off.bind(items.select(), None)[0].startswith("SELECT")
    assert len(off) == 0


def test_an_insert_without_values_compiles_once_per_set_of_columns() -> None:
    cache, conn = StatementCache(), make()
    insert, select = items.insert(), sa.select(items.c.id).where(items.c.name == sa.bindparam("n"))
    for i in range(3):
        run(cache, conn, insert, {"name": f"a{i}"})
        run(cache, conn, insert, {"name": f"b{i}", "id": -1 - i})
        run(cache, conn, select, {"n": "a0"})
    assert cache.misses == 3 and len(cache) == 2  # two column sets of one insert, one select
    assert cache.statement(insert, {"name": "x"}) is cache.statement(insert, {"name": "y"})
    assert cache.statement(insert, {"name": "x"}) is not cache.statement(insert, {"name": "x", "id": 1})
    assert run(cache, conn, sa.select(items.c.id, items.c.name).order_by(items.c.id)) == [
        (-3, "b2"), (-2, "b1"), (-1, "b0"), (1, "a0"), (2, "a1"), (3, "a2"),
    ]
    assert run(cache, conn, select, {"n": "a0"}) == [(1,)]


def test_a_callable_default_takes_the_slow_path() -> None:
    cache, conn = StatementCache(), make()
    stmt = sa.select(items.c.id).where(items.c.name == sa.bindparam("n", callable_=lambda: "late"))
    conn.execute("INSERT INTO items (id, name) VALUES (7, 'late')")
    assert cache.statement(stmt, None).slow
    assert run(cache, conn, stmt) == [(7,)]


def test_the_cache_compiles_for_its_dialect() -> None:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    assert StatementCache().size == 512
    stmt = sa.update(items).where(items.c.id == sa.bindparam("key")).values(name=sa.bindparam("name"))
    assert "?" in StatementCache().statement(stmt, {"key": 1, "name": "x"}).sql
    pg = StatementCache(dialect=PGDialect_psycopg()).statement(stmt, {"key": 1, "name": "x"}).sql
    assert "%(name)s" in pg and "%(key)s" in pg and "?" not in pg
