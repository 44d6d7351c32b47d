"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar."""

from .app import DATASTAR_CDN, Lith
from .commands import Command, Rejected, TabCommand, TabId, new_tab, pending, send, tab_signals
from .db import Db
from .exceptions import (
    DatabaseError,
    LithError,
    MigrationError,
    MissingParameter,
    NotOneRow,
    NotRunning,
    OutcomeLost,
    SettingError,
    ViewError,
    WriterClosed,
)
from .streams import Frame, Stream
from .views import fragment
from .writer import Tx, Writer

__all__ = [
    "DATASTAR_CDN",
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
    "Rejected",
    "SettingError",
    "Stream",
    "TabCommand",
    "TabId",
    "Tx",
    "ViewError",
    "Writer",
    "WriterClosed",
    "fragment",
    "new_tab",
    "pending",
    "send",
    "tab_signals",
]
__version__ = "0.1.0"
