"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar."""

from .accounts import ACCOUNT_NAME, Account, Accounts
from .app import Lith
from .db import Db
from .exceptions import (
    AccountUnavailable,
    DatabaseError,
    LithError,
    MigrationError,
    MissingParameter,
    NotOneRow,
    NotRunning,
    OutcomeLost,
    SettingError,
    UnknownAccount,
    ViewError,
    WriterClosed,
)
from .streams import Frame, Stream
from .views import fragment
from .writer import Command, Tx, Writer

__all__ = [
    "ACCOUNT_NAME",
    "Account",
    "AccountUnavailable",
    "Accounts",
    "Command",
    "DatabaseError",
    "Db",
    "Frame",
    "Lith",
    "LithError",
    "MigrationError",
    "MissingParameter",
    "NotOneRow",
    "NotRunning",
    "OutcomeLost",
    "SettingError",
    "Stream",
    "Tx",
    "UnknownAccount",
    "ViewError",
    "Writer",
    "WriterClosed",
    "fragment",
]
__version__ = "0.1.0"
