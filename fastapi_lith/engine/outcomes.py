"""Exactly once: idempotency keys, and the first outcome of each keyed command.

Datastar retries a POST after a network error, so a command whose transaction committed but
whose answer was lost would apply twice. A keyed command's outcome is written in the same
transaction as the command; a repeat within the window finds it and is not applied again.

An outcome is stored as data, never as code: JSON, read back through pydantic against the
result type the command's `apply` declares. Whoever can write the database (or a backup or a
replica it is restored from) can change an outcome as they can change any row, but cannot make
the app run anything: a row that is not JSON of the expected shape (a pickle of an earlier
version, an edited row) is refused, and its command is still not applied again.

    NULL                                  the result None: the common case, and no JSON to read
    ["ok", result]                        any other result, as JSON of the declared type
    ["rejected", "message"]               a `Rejected`: a repeat raises `Rejected(message)`
    ["failed", "module.Type", "message"]  any other error: a repeat raises `FirstAttemptFailed`
    ["lost", "why"]                       a result that is not JSON of its type: `OutcomeLost`
"""

from __future__ import annotations

import functools
import json
import logging
import re
import weakref
from typing import Annotated, Any, Literal, Union, get_type_hints

import htpy as h
from markupsafe import Markup, escape
from pydantic import ConfigDict, Discriminator, JsonValue, Tag, TypeAdapter, ValidationError
from sqlalchemy import text

from ..exceptions import FirstAttemptFailed, OutcomeLost, OutcomeRefused, Rejected
from .db import Db

log = logging.getLogger("fastapi_lith")

# What an `Idempotency-Key` header may hold (web/dependency.py).
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")

# The library's own table: each keyed command's first outcome, written in the command's own
# transaction, so a repeat that finds no row knows the first never committed. A rowid table:
# rows append in time order and only the small key index takes scattered inserts (keyed by
# the key text, WITHOUT ROWID, each insert split pages all over the tree and cost far more).
OUTCOMES_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_outcome (key TEXT NOT NULL UNIQUE, at REAL NOT NULL, outcome BLOB);
CREATE INDEX IF NOT EXISTS lith_outcome_at ON lith_outcome (at);
"""
FIND_OUTCOME = "SELECT outcome FROM lith_outcome WHERE key = ? AND at >= ?"
RECORD_OUTCOME = "INSERT OR REPLACE INTO lith_outcome (key, at, outcome) VALUES (?, ?, ?)"
PRUNE_OUTCOMES = "DELETE FROM lith_outcome WHERE at < ?"

# Each tab's latest outcome, for its outcome view: one row per tab, written by the writer after
# each `TabCommand` in the command's own transaction. An older op arriving late (a retry) does
# not overwrite a newer one, so `done` never moves back and a newer button never hangs.
TABS_SCHEMA = """
CREATE TABLE IF NOT EXISTS lith_tab (
    tab TEXT PRIMARY KEY, op INTEGER NOT NULL, ok INTEGER NOT NULL, message TEXT, at REAL NOT NULL
);
"""
# `text`: the statement cache binds them for SQLite and for PostgreSQL alike.
RECORD_TAB = text(
    "INSERT INTO lith_tab (tab, op, ok, message, at) VALUES (:tab, :op, :ok, :message, :at) "
    "ON CONFLICT (tab) DO UPDATE SET op = excluded.op, ok = excluded.ok, "
    "message = excluded.message, at = excluded.at WHERE excluded.op >= lith_tab.op"
)
LAST_TAB = text("SELECT op, ok, message FROM lith_tab WHERE tab = :tab")
# A tab's outcome outlives the repeat window: a page left open for days still shows its last one.
TAB_KEEP = 7 * 24 * 3600.0
PRUNE_TABS = "DELETE FROM lith_tab WHERE at < ?"


# -- an outcome as JSON ----------------------------------------------------------------------

# A float result keeps NaN and the infinities (plain JSON has neither; pydantic reads them back).
_JSON = ConfigDict(ser_json_inf_nan="constants")


def _kind(row: Any) -> str | None:
    """Which shape a row claims to be: its first item."""
    return row[0] if isinstance(row, (list, tuple)) and row and isinstance(row[0], str) else None


_ERROR_ROWS = (
    Annotated[tuple[Literal["rejected"], str], Tag("rejected")],
    Annotated[tuple[Literal["failed"], str, str], Tag("failed")],
    Annotated[tuple[Literal["lost"], str], Tag("lost")],
)


def _rows(declared: Any) -> TypeAdapter[Any]:
    """Every row a command's outcome may be, with its result as `declared` (None: no result
    can be read, only errors)."""
    shapes = _ERROR_ROWS if declared is None else (Annotated[tuple[Literal["ok"], declared], Tag("ok")], *_ERROR_ROWS)
    row: Any = Annotated[Union[shapes], Discriminator(_kind)]  # noqa: UP007 - a union built at run time
    return TypeAdapter(row, config=_JSON)


_ERRORS_ONLY = _rows(None)


def declared_result(command: type[Any]) -> Any:
    """What `command.apply` says it returns: its return annotation, or JSON data (`JsonValue`:
    dicts, lists, strings, numbers, booleans, None) if it has none or says `Any` or `object`."""
    declared = get_type_hints(command.apply, include_extras=True).get("return", Any)
    return JsonValue if declared is Any or declared is object else declared


class _Codec:
    """One command class's outcomes, made once: its rows' adapter, or why its result type cannot
    be stored (then its results are lost, and its errors still come back)."""

    __slots__ = ("declared", "rows", "unusable")

    def __init__(self, command: type[Any]) -> None:
        self.declared = "JSON data"
        self.unusable: str | None = None
        try:
            declared = declared_result(command)
            if declared is not JsonValue:
                self.declared = declared.__qualname__ if isinstance(declared, type) else repr(declared)
            self.rows = _rows(declared)
        except Exception as exc:  # noqa: BLE001 - a type pydantic cannot handle, a name it cannot resolve
            self.unusable = f"{command.__qualname__}.apply's result type cannot be stored as JSON: {exc}"
            self.declared, self.rows = "a type that cannot be stored", _ERRORS_ONLY
            log.warning("%s, so a repeat of this command raises OutcomeLost", self.unusable)


_CODECS: weakref.WeakKeyDictionary[type[Any], _Codec] = weakref.WeakKeyDictionary()


def _codec(command: type[Any]) -> _Codec:
    codec = _CODECS.get(command)
    if codec is None:
        codec = _CODECS[command] = _Codec(command)
    return codec


def _why(exc: Exception, *, in_result: bool = False) -> str:
    """A validation error in one line, without the input (a row may be large, or hostile);
    `in_result`: where in the result, not in the row `["ok", result]`."""
    if not isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: {exc}"
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    where = ".".join(str(part) for part in first["loc"][2 if in_result else 0 :])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"


def _error_type(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - an error whose __str__ fails still fails its command
        return f"(the message of this {type(error).__name__} could not be read)"


def dump_outcome(command: type[Any], result: Any, error: BaseException | None) -> bytes | None:
    """The outcome of a keyed `command` as stored: NULL for the common `None` result, else JSON.

    Never raises: the command has applied (or rolled back) by now, so a result that is not JSON
    of its declared type is recorded as lost, and the command stays applied once.
    """
    if error is not None:
        if isinstance(error, Rejected):
            return json.dumps(["rejected", _message(error)]).encode()
        return json.dumps(["failed", _error_type(error), _message(error)]).encode()
    if result is None:
        return None
    codec = _codec(command)
    if codec.unusable is not None:
        return json.dumps(["lost", f"the command was applied once; {codec.unusable}"]).encode()
    try:
        return codec.rows.dump_json(codec.rows.validate_python(("ok", result), strict=True))
    except Exception as exc:  # noqa: BLE001 - an unstorable result must not fail the command
        why = (f"the command was applied once; its result ({type(result).__name__}) could not be "
               f"stored as {codec.declared}: {_why(exc, in_result=True)}")
        return json.dumps(["lost", why]).encode()


def load_outcome(command: type[Any], stored: object) -> tuple[Any, BaseException | None]:
    """What a repeat of `command` answers, from its stored outcome: `(result, None)`, or
    `(None, error)`. Nothing is built from the row but the declared result type and the
    library's own errors; a row of any other shape is refused (`OutcomeRefused`)."""
    if stored is None:
        return None, None
    codec = _codec(command)
    try:
        if not isinstance(stored, (bytes, str)):  # a planted row may hold any SQLite type
            raise TypeError(f"the row holds {type(stored).__name__}, not JSON text")
        row = codec.rows.validate_json(stored)
    except Exception as exc:  # noqa: BLE001 - an app's validator may raise anything on a hostile row
        return None, OutcomeRefused(
            "the command's first send committed, so it is not applied again, but its recorded outcome "
            f"is refused: not JSON of an outcome with a result of {codec.declared} ({_why(exc)})"
        )
    kind = row[0]
    if kind == "ok":
        return row[1], None
    if kind == "rejected":
        return None, Rejected(row[1])
    if kind == "failed":
        return None, FirstAttemptFailed(row[1], row[2])
    return None, OutcomeLost(row[1])


@functools.lru_cache(maxsize=16)
def _no_outcome(hint: str) -> Markup:
    """A tab with no op yet: the same HTML for every tab, rendered once (a deploy's thousands
    of reconnecting tabs each open with it)."""
    return Markup(h.div("#outcome.outcome", {"data-signals:done": "0"}, role="status")[
        hint and h.p(".message.hint", {"data-show": "$done == 0"})[hint], h.div("#lith-error")
    ])


def outcome_view(db: Db, tab: str, *, hint: str = "") -> Markup:
    """The built-in `"outcome/{tab}"` view: the outcome of the tab's newest op, and `done` set to it.

    A new op starts a fresh outcome. The message belongs to one op and shows only while `done` is
    that op (`data-show`), so a refused request's error, pushed into `#lith-error` with `done` set
    to its own op, replaces the message of the op before rather than sitting under it. A command
    that succeeds without `say()` shows no message. `ok_op` is set when it succeeded, so a page
    can clear or close the form that sent it.

    Rendered once for every command a tab sends, so built as text, not as htpy elements: the
    HTML htpy would build from the same parts, each escaped (`op` an integer).
    """
    last = db.first(LAST_TAB, {"tab": tab})
    if last is None:
        return _no_outcome(hint)
    op, message = int(last["op"]), last["message"]
    if last["ok"]:
        signals = f'data-signals:done="{op}" data-signals:ok_op="{op}"'
        said = f'class="message ok" data-show="$done == {op}"'
    else:
        signals = f'data-signals:done="{op}"'
        said = f'class="message failed" data-show="$done == {op}" role="alert"'
    shown = f"<p {said}>{escape(message)}</p>" if message else ""
    return Markup(f'<div id="outcome" class="outcome" {signals} role="status">{shown}<div id="lith-error"></div></div>')
