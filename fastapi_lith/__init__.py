"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar."""

from .app import Lith
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
from .writer import Command, Tx, Writer

__all__ = [
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
    "ViewError",
    "Writer",
    "WriterClosed",
    "fragment",
]
__version__ = "0.1.0"
