"""A command whose batch fails at its COMMIT, for the tracing tests in process and served.

The tables are the tests' own beside the counter's: a child row whose parent never exists fails
the whole batch at COMMIT, where SQLite checks a deferred foreign key.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from fastapi_lith import Command, Tx


def add_orphan_tables(path: str | Path) -> None:
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS orphan (parent INTEGER REFERENCES orphan_parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute("CREATE TABLE IF NOT EXISTS orphan_parent (id INTEGER PRIMARY KEY)")


class Orphan(Command):
    def apply(self, tx: Tx) -> None:
        tx.execute("INSERT INTO orphan (parent) VALUES (404)")
        tx.touch("counter")
