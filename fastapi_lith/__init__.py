"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar."""

from .app import Lith
from .db import Db, MigrationError
from .streams import Frame, Stream
from .views import ViewError, fragment
from .writer import Command, Tx, Writer, WriterClosed

__all__ = [
    "Command",
    "Db",
    "Frame",
    "Lith",
    "MigrationError",
    "Stream",
    "Tx",
    "ViewError",
    "Writer",
    "WriterClosed",
    "fragment",
]
__version__ = "0.1.0"
