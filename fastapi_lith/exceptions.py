"""One base for every error the library raises, so an app can catch them all at once.

Each error also keeps the built-in base it had before (`RuntimeError`, `ValueError`), so
`except ValueError` around a view key or `except RuntimeError` around a closed writer still
catches it.
"""

from __future__ import annotations

from typing import Any


class LithError(Exception):
    """The base of fastapi-lith's own errors."""


class SettingError(LithError, ValueError):
    """A setting or argument the app gives the library (`Lith`, `Writer`, an encoder, a backup
    timer, a page helper's tab id) is out of range or not one of the allowed values."""


class NotRunning(LithError, RuntimeError):
    """The app's lifespan has not started (or has ended): no hub, no readers."""


class AlreadyRunning(LithError, RuntimeError):
    """The app's lifespan was started again while it runs: one app, one writer, one hub.

    A second start (`Tabs(lith)` inside a served app, two `lifespan`s) would replace the
    running writer and hub under their callers; it is refused, and the first runs on.
    """


class WriterClosed(LithError, RuntimeError):
    """The writer is shutting down or was never started: the command was not accepted."""


class MigrationError(LithError, RuntimeError):
    """A migration could not be applied, or the database is newer than the app."""


class DatabaseError(LithError, RuntimeError):
    """The SQLite file cannot be used as the library needs it (no WAL mode)."""


class CommandError(LithError, TypeError):
    """A command the writer cannot apply as written: an `async def apply`, or an `apply` that
    returned an awaitable. A bug in the command, found where it is defined or first applied."""


class Rejected(LithError):
    """Raised from `apply`: this command cannot apply, and the message says why, to a person.

    The command's savepoint rolls back (nothing it wrote stays), a `TabCommand`'s tab is told the
    message in its outcome view, and `writer.do` raises it to the caller. A command route made by
    `lith.command` answers 204 for a tab command (the tab already has the message) and 409 with
    the message for any other command; so does a hand-written route that lets it through.
    """

    # The command `writer.do` was applying when it raised this (None if raised elsewhere): a
    # `Command`, typed loosely because the commands sit above this module.
    command: Any = None


class MissingParameter(LithError, KeyError):
    """A statement was run without a value for one of its bind parameters."""


class NotOneRow(LithError, LookupError):
    """`db.one()` found no row, or several: the usual guard for "this card must exist"."""


class ViewError(LithError, ValueError):
    """A view key, a parameter or a view's output is unusable."""


class BadParameter(ViewError):
    """A view's parameter is not of its type or outside SQLite's integers: the request's fault.

    `lith.install` answers it with 400 and the reason (through the app's HTTP error handler),
    so a page whose path parameter reaches `lith.render` needs no handler of its own, and the
    stream route says the same for the same key.
    """


class AccessDenied(LithError, PermissionError):
    """A stream may not watch what it asked for: another principal's `{principal}` view, a view
    whose `access` rule said no, a stream token that is missing, forged, edited or expired, or a
    stream of a principal `lith.revoke` cut off while it opened. The stream route answers it as
    a refusal (web/access.py); the message says what, never why the rule said no."""


class OutcomeLost(LithError):
    """A repeated command's first outcome was recorded but cannot be given back.

    The command's first send committed (applied, or failed and rolled back) and the repeat is
    not applied again; only its result could not be stored as JSON of the type `apply` declares
    (or its error's message could not be read).
    """


class OutcomeRefused(OutcomeLost):
    """A repeated command's recorded outcome is not JSON of the shape its command declares.

    A row written by an earlier version (a pickle), edited, or planted through the database, a
    backup or a replica: nothing in it is run or constructed, and the command is not applied
    again.
    """


class FirstAttemptFailed(LithError, RuntimeError):
    """A repeat of a command whose first send failed with an error other than `Rejected`.

    The first error's class is not rebuilt from the database: `error_type` names it and
    `message` is its text, as recorded. Nothing was applied, then or now.
    """

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"the first send of this command failed with {error_type}: {message}; "
                         "it is not applied again")
        self.error_type = error_type
        self.message = message


class UnknownAccount(LithError, LookupError):
    """No account has that name (or the name cannot be one): a request for it is a 404."""


class AccountUnavailable(LithError, RuntimeError):
    """An account's database cannot open (a migration failed); other accounts still serve."""


class StorageError(LithError, RuntimeError):
    """A write failed for a reason outside the command (disk full, read-only file, I/O error):
    nothing in its batch was applied, and it may be sent again once the storage is fixed."""


class EncoderClosed(LithError, RuntimeError):
    """A stream's encoder was used after `close()`: the stream it compressed has ended."""


class BackupError(LithError):
    """A copy could not be taken, checked or restored (`fastapi_lith.ops`)."""


class InUse(BackupError):
    """Another process holds the database open: it must be stopped first."""


class ReplicaError(BackupError):
    """A replica cannot be used: no binary, no credentials, a bad URL, or Litestream failed."""


class ProjectError(LithError):
    """A project could not be written: a bad name, a folder in the way, a missing template."""
