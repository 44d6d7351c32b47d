"""The app's one `Lith`: the SQLite file, its migrations, and where the page loads Datastar from.

Its own module so that commands, views and routes can all import it without a cycle.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi_lith import Lith
from fastapi_lith.app import DATASTAR_CDN

lith = Lith(
    os.environ.get("KANBAN_DB", "kanban.db"),
    migrations=Path(__file__).parent / "migrations",
    datastar_url=os.environ.get("DATASTAR_URL", DATASTAR_CDN),
)
