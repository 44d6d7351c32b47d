"""Writes that fail for a reason outside the command: a full disk, a read-only file, an I/O error.

No command is at fault, so none is blamed: the whole batch is refused with `StorageError`
(503, nothing applied, the tab may send it again), the cause is logged once rather than per
command, and the app's health route says so (`Writer.probe`) until a write succeeds again.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any

from sqlalchemy import text

from ..exceptions import StorageError
from .commands import Command
from .outcomes import RECORD_TAB

log = logging.getLogger("fastapi_lith.writer")

# SQLite's primary result codes that say the storage failed, not the statement.
_SQLITE_STORAGE = {
    8: "SQLITE_READONLY",
    10: "SQLITE_IOERR",
    11: "SQLITE_CORRUPT",
    13: "SQLITE_FULL",
    14: "SQLITE_CANTOPEN",
    26: "SQLITE_NOTADB",
}


def storage_cause(exc: BaseException) -> str | None:
    """Why the storage refused a write (`"SQLITE_FULL: database or disk is full"`), or None
    when `exc` is the command's own error."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    if code is None or code & 0xFF not in _SQLITE_STORAGE:
        return None
    return f"{getattr(exc, 'sqlite_errorname', None) or _SQLITE_STORAGE[code & 0xFF]}: {exc}"


class StorageState:
    """The writer's last storage failure, logged when it starts, changes and ends."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        #: The cause of the last failed write, None once a write succeeded.
        self.failure: str | None = None

    def refusal(self, exc: BaseException) -> BaseException:
        """What the callers of a failed batch get: a `StorageError` if the storage failed
        (logged once per cause), else `exc` itself."""
        cause = storage_cause(exc)
        if cause is None:
            return exc
        self.failed(cause, exc)
        error = StorageError(f"the database cannot be written: {cause}")
        error.__cause__ = exc
        return error

    def failed(self, cause: str, exc: BaseException) -> None:
        if cause != self.failure:
            # Once per cause: a full disk fails every command, and a log line per command
            # would fill what little space is left.
            log.error("writes fail: %s; commands are refused (503) until a write succeeds", cause, exc_info=exc)
            self.failure = cause

    def succeeded(self) -> None:
        if self.failure is not None:
            log.info("writes succeed again (they failed with %s)", self.failure)
            self.failure = None



_PROBE = {"tab": "~probe", "op": 0, "ok": 1, "message": None}  # no tab id has a '~'
_FORGET_PROBE = text("DELETE FROM lith_tab WHERE tab = :tab")


class Probe(Command):
    """`Writer.probe`'s write: a row in the tabs' table, deleted at once. The file takes a
    page and nothing changes, on SQLite and PostgreSQL alike."""

    def apply(self, tx: Any) -> None:
        tx.execute(RECORD_TAB, {**_PROBE, "at": time.time()})
        tx.execute(_FORGET_PROBE, {"tab": _PROBE["tab"]})
