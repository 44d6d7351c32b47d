"""fastapi-lith: live, multiplayer HTML apps for FastAPI on SQLite and Datastar."""

from .app import Lith
from .db import MigrationError
from .writer import Command, Tx, Writer, WriterClosed

__all__ = ["Command", "Lith", "MigrationError", "Tx", "Writer", "WriterClosed"]
__version__ = "0.1.0"
