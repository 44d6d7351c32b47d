"""`Db`, what views and commands read and write through, and the migration files, on any backend.

Opening a database and applying the files is each backend's own (backends/sqlite/db.py,
backends/postgres/db.py): here is only what both share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.sql import ClauseElement

from ..exceptions import MigrationError, NotOneRow
from .statements import Params, Statement, StatementCache

# SQLite stores integers in 64 bits: a larger Python int makes sqlite3 raise OverflowError.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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

    def __init__(self, conn: Any, cache: StatementCache | None = None) -> None:
        cache = cache if cache is not None else StatementCache()
        self.conn = conn
        # One cursor for every statement: a new cursor per statement costs more than the
        # statement itself (about 1.2 µs against 1 µs for a one-row UPDATE).
        self._cursor = conn.cursor()
        self._cache = cache
        self._compiled = cache.compiled

    @property
    def cursor(self) -> Any:
        """The shared cursor, for the writer's own statements (BEGIN, SAVEPOINT, COMMIT)."""
        return self._cursor

    def execute(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> Any:
        """Run one statement; the cursor gives `rowcount`, `lastrowid` and the rows.

        The cursor is shared: read it before the next statement, or use `all()`.
        """
        if isinstance(stmt, str):
            return self._cursor.execute(stmt, params or ())
        entry = self._compiled.get(stmt)  # the common case in one lookup, without a call
        if entry.__class__ is not Statement:
            entry = self._cache.statement(stmt, params)  # type: ignore[arg-type]
        sql, values = entry.bind(params)  # type: ignore[arg-type]
        return self._cursor.execute(sql, values)

    def executemany(self, stmt: ClauseElement | str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Run one statement for many parameter sets; returns the rows changed."""
        changed: int
        if isinstance(stmt, str):
            changed = self._cursor.executemany(stmt, rows).rowcount
            return changed
        rows = list(rows)
        if not rows:
            return 0
        entry = self._cache.statement(stmt, rows[0])  # the rows share their keys, as in DB-API
        if entry.slow:  # expanding IN and the like: the SQL may differ from row to row
            return sum(self.execute(stmt, row).rowcount for row in rows)
        # One prepared statement for every row: 23% less than a loop of execute for 50 rows.
        changed = self._cursor.executemany(entry.sql, [entry.bind(row)[1] for row in rows]).rowcount
        return changed

    def all(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> list[Any]:
        found: list[Any] = self.execute(stmt, params).fetchall()
        return found

    def first(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> Any:
        return self.execute(stmt, params).fetchone()

    def one(self, stmt: ClauseElement | str, params: Params | Sequence[Any] = None) -> Any:
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
