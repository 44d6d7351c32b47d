"""A database whose index is out of step with its table: the damage `integrity_check` finds and
`quick_check` does not, made as it happens, with rows changed while SQLite could not see the index.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path


def index_out_of_step(path: Path, *, rows: int = 200, changed: int = 25) -> None:
    """Table `card` with index `card_lane`: its first `changed` rows moved to lane 'done' while
    the index still holds them under 'todo'."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            "CREATE TABLE card (id INTEGER PRIMARY KEY, title TEXT, lane TEXT);"
            "CREATE INDEX card_lane ON card (lane);"
        )
        conn.executemany("INSERT INTO card (title, lane) VALUES (?, ?)", [(f"t{i}", "todo") for i in range(rows)])
        conn.commit()
        index = conn.execute("SELECT * FROM sqlite_schema WHERE name = 'card_lane'").fetchone()
        conn.execute("PRAGMA writable_schema = ON")  # hide the index from SQLite for a moment
        conn.execute("DELETE FROM sqlite_schema WHERE name = 'card_lane'")
        conn.commit()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE card SET lane = 'done' WHERE id <= ?", (changed,))  # the index keeps 'todo'
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("INSERT INTO sqlite_schema VALUES (?, ?, ?, ?, ?)", index)
        conn.commit()
