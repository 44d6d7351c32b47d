"""The app's one `Lith`: the SQLite file, its migrations, and where the page loads Datastar from.

Its own module so that commands, views and routes can all import it without a cycle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi_lith import DATASTAR_CDN, Lith


def wording(error: Mapping[str, Any]) -> str | None:
    """The board's own words for a form error (pydantic's error in); None keeps pydantic's."""
    limit = error.get("ctx", {})
    match error["type"]:
        case "string_too_short":
            n = limit["min_length"]
            return f"Write at least {n} character{'s' if n != 1 else ''}."
        case "string_too_long":
            return f"Too long: keep it to at most {limit['max_length']} characters."
        case "json_invalid":
            return "The page sent something unreadable: reload it and try again."
    return None


lith = Lith(
    os.environ.get("KANBAN_DB", "kanban.db"),
    migrations=Path(__file__).parent / "migrations",
    datastar_url=os.environ.get("DATASTAR_URL", DATASTAR_CDN),
    messages=wording,
    outcome_hint="Changes you make show up for everyone on this board at once.",
)
