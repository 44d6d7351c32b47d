"""The statement cache: compile a SQLAlchemy Core statement once, run its SQL text many times.

Measured on SQLite 3.40 / Python 3.11: a savepointed one-UPDATE command costs about 1.5 µs in raw
sqlite3, 10 µs through `Connection.execute` of a prebuilt statement and 60 µs when the statement
is rebuilt per call. So the writer keeps the compiled SQL text and hands it to the DBAPI cursor,
whose own cache (`cached_statements`) keeps the prepared statement. Build statements once, at
module level: the cache is keyed by the statement object.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from ..exceptions import MissingParameter

DIALECT = sqlite.dialect(paramstyle="qmark")

Params = Mapping[str, Any] | None


class Statement:
    """One compiled statement: its SQL text and how to turn a parameter dict into a tuple."""

    __slots__ = ("compiled", "sql", "_names", "_defaults", "_get", "slow")

    def __init__(self, compiled: SQLCompiler) -> None:
        self.compiled = compiled
        self.sql: str = compiled.string
        names = tuple(compiled.positiontup or ())
        binds = compiled.binds
        self._names = names
        # Values fixed at build time, such as the 1 in `where(table.c.id == 1)`.
        self._defaults = {
            n: binds[n].effective_value for n in names if not (binds[n].required or binds[n].callable)
        }
        getter = operator.itemgetter(*names) if names else (lambda _: ())
        self._get: Callable[[Mapping[str, Any]], Any] = (
            (lambda p: (getter(p),)) if len(names) == 1 else getter
        )
        # Type processors (dates, booleans, JSON), callables and expanding IN need SQLAlchemy's
        # own parameter code, which costs about 1 µs more per call; plain columns do not.
        self.slow = bool(
            compiled._bind_processors  # noqa: SLF001 - SQLAlchemy's own, read to pick the fast path
            or compiled.post_compile_params
            or compiled.literal_execute_params
            or any(binds[n].callable for n in names)
        )

    def bind(self, params: Params) -> tuple[str, Sequence[Any]]:
        """The SQL text and positional parameters for one execution."""
        if self.slow:
            return self._bind_slow(params or {})
        if self._defaults:
            params = {**self._defaults, **params} if params else self._defaults
        try:
            return self.sql, self._get(params or {})
        except KeyError as exc:
            raise MissingParameter(f"missing parameter {exc} for: {self.sql}") from None

    def _bind_slow(self, params: Mapping[str, Any]) -> tuple[str, Sequence[Any]]:
        compiled = self.compiled
        if compiled.post_compile_params or compiled.literal_execute_params:
            state = compiled.construct_expanded_state(params)
            sql, names, values = state.statement, state.positiontup or [], state.parameters
        else:
            sql, names, values = self.sql, self._names, compiled.construct_params(params)
        # A processor per name (a sequence only for tuple parameters, which the SQLite and
        # PostgreSQL dialects expand before this point).
        processors: Mapping[str, Any] = compiled._bind_processors  # noqa: SLF001 - as in __init__
        out = []
        for name in names:
            value = values[name]
            process = processors.get(name)
            out.append(process(value) if process is not None and value is not None else value)
        return sql, out


def compile_statement(stmt: ClauseElement, keys: Sequence[str] = (), dialect: Dialect = DIALECT) -> Statement:
    # column_keys makes `table.insert()` without .values() name exactly the given columns.
    return Statement(cast(SQLCompiler, stmt.compile(dialect=dialect, column_keys=list(keys))))


class StatementCache:
    """Compiled statements keyed by the statement object (and, where the SQL depends on them,
    the parameter names: `table.insert()` without `.values()` names the columns it is given).

    Bounded, oldest evicted first, so a statement rebuilt on every call costs a compile each
    time (as it would anyway) without growing memory.
    """

    def __init__(self, size: int = 512, *, enabled: bool = True, dialect: Dialect = DIALECT) -> None:
        self.size = size
        self.enabled = enabled
        self.dialect = dialect  # SQLite's; the PostgreSQL backend passes its own
        self.compiled: dict[ClauseElement, Statement | dict[tuple[str, ...], Statement]] = {}
        self.misses = 0

    def statement(self, stmt: ClauseElement, params: Params) -> Statement:
        """The compiled form of `stmt` for these parameter names, compiling it on a miss."""
        entry = self.compiled.get(stmt)
        if entry.__class__ is Statement:
            return entry
        keys = tuple(params) if params else ()
        if entry is not None:
            variant = entry.get(keys)  # type: ignore[union-attr]
            if variant is not None:
                return variant
        return self._compile(stmt, keys, entry)

    def bind(self, stmt: ClauseElement, params: Params) -> tuple[str, Sequence[Any]]:
        return self.statement(stmt, params).bind(params)

    def _compile(
        self, stmt: ClauseElement, keys: tuple[str, ...], variants: Any
    ) -> Statement:
        compiled = compile_statement(stmt, keys, self.dialect)
        if not self.enabled:
            return compiled
        self.misses += 1
        if variants is None:
            if len(self.compiled) >= self.size:
                del self.compiled[next(iter(self.compiled))]
            # Only INSERT and UPDATE can name columns by their parameters; other statements
            # skip the second compile that proves the parameters did not change the SQL.
            if keys and (not stmt.is_dml or compile_statement(stmt, (), self.dialect).sql == compiled.sql):
                self.compiled[stmt] = compiled
                return compiled
            variants = self.compiled[stmt] = {}
        variants[keys] = compiled
        return compiled

    def __len__(self) -> int:
        return len(self.compiled)
